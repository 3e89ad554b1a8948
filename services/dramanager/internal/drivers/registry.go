// Package drivers keeps the dramanager's connections to DRA drivers, as the
// kubelet's DRA plugin manager (pkg/kubelet/cm/dra/plugin) does: each
// registered instance of a driver is dialled and its connection kept;
// several instances of one driver may be registered at once (the
// kubeletplugin helper's rolling-update mode: distinct sockets, one driver
// name) and the newest connected one serves. When no instance of a driver
// stays connected past a delay, the driver's ResourceSlices for this node
// are deleted, as the kubelet deletes them.
//
// Unlike the kubelet, which deletes all of the node's slices the moment it
// starts, the registry waits the same delay after its start before it
// deletes the slices of the drivers that have not registered (again) by
// then: after a dramanager restart the reconciler registers the
// drivers anew, and deleting at once would wipe the slices of drivers that
// never stopped serving, which then publish them again — a dip in what
// the node offers, for nothing.
package drivers

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
)

// DefaultDisconnectDelay is how long a driver may have no connected
// instance before its ResourceSlices are deleted (the kubelet's wiping
// delay).
const DefaultDisconnectDelay = 30 * time.Second

// CallTimeout bounds every call to a driver (the kubelet's
// defaultClientCallTimeout).
const CallTimeout = 45 * time.Second

// HealthServices are the DRAResourceHealth services the registry records,
// the preferred first (the kubelet's healthServicesSupportedByKubelet).
var HealthServices = []string{"v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"}

// Config configures a Registry.
type Config struct {
	// Client reaches the API server holding the ResourceSlices. Nil: no
	// slices are ever deleted (there is no API to delete them from).
	Client kubernetes.Interface
	// NodeName is this node; only its slices are deleted. Required with
	// Client.
	NodeName string
	// Identity is who the API refuses when it refuses a deletion (named in
	// the log); nil: not known.
	Identity *kubeaccess.Identity
	// AllowedDirs confine the endpoints that may be dialled (DESIGN
	// "Dialling"); required.
	AllowedDirs []string
	// DisconnectDelay defaults to DefaultDisconnectDelay.
	DisconnectDelay time.Duration
	Log             *slog.Logger
	// Registerer receives the metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// Slices, when set, counts this node's ResourceSlices of a driver in a
	// watch cache of them (slicewatch.Slices.Count); ok is false until the
	// cache has listed. A deletion then takes the count from it instead of
	// listing, and makes no API call at all for a driver of which the
	// cache holds no slice: a thousand drivers leaving cost a thousand
	// List and DeleteCollection pairs before, for slices most never had.
	Slices func(driver string) (n int, ok bool)
}

// Registration is one instance of a driver, as the reconciler's DRA
// handler found it.
type Registration struct {
	Driver     string
	Endpoint   string   // absolute path of the DRA service socket
	Services   []string // GetInfo's supported versions
	SocketPath string   // the registration socket
	Generation string   // of the registration socket
}

// Registry holds the drivers' instances. Its methods are safe for
// concurrent use.
type Registry struct {
	cfg      Config
	confiner *unixsock.Confiner
	log      *slog.Logger
	metrics  *metrics
	now      func() time.Time

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	drivers map[string][]*instance // by driver name, oldest first
	// byEndpoint indexes drivers' instances by endpoint (one each): a
	// registration finds the one it replaces without walking them all.
	byEndpoint map[string]*instance
	wipes      map[string]*wipe // pending deletion of a driver's slices
	closed     bool
}

// New returns a registry; Start begins the sweep of the slices of drivers
// that do not come back after a restart.
func New(cfg Config) (*Registry, error) {
	if cfg.Client != nil && cfg.NodeName == "" {
		return nil, fmt.Errorf("DRA registry: a node name is required with a Kubernetes client: %w", errdefs.ErrInvalidArgument)
	}
	if len(cfg.AllowedDirs) == 0 {
		return nil, fmt.Errorf("DRA registry: no allowed endpoint directories: %w", errdefs.ErrInvalidArgument)
	}
	conf, err := unixsock.NewConfiner(cfg.AllowedDirs)
	if err != nil {
		return nil, err
	}
	if cfg.DisconnectDelay <= 0 {
		cfg.DisconnectDelay = DefaultDisconnectDelay
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Registry{
		cfg: cfg, confiner: conf, log: cfg.Log, metrics: newMetrics(cfg.Registerer), now: time.Now,
		ctx: ctx, cancel: cancel,
		drivers: map[string][]*instance{}, byEndpoint: map[string]*instance{}, wipes: map[string]*wipe{},
	}, nil
}

// DisconnectDelay is the configured delay.
func (r *Registry) DisconnectDelay() time.Duration { return r.cfg.DisconnectDelay }

// Close closes every connection and stops pending deletions. It never
// deletes slices: a restart resumes where this one stopped.
func (r *Registry) Close() {
	r.mu.Lock()
	r.closed = true
	var all []*instance
	for _, list := range r.drivers {
		all = append(all, list...)
	}
	for d, w := range r.wipes {
		w.stop()
		delete(r.wipes, d)
	}
	r.mu.Unlock()
	r.cancel()
	for _, in := range all {
		in.close()
	}
	r.wg.Wait()
}

// ValidateRegistration checks a registration's fields, with errors
// wrapping errdefs.ErrInvalidArgument; it returns the DRA service chosen.
func ValidateRegistration(reg Registration) (string, error) {
	if err := bounds.Name("DRA driver name", reg.Driver); err != nil {
		return "", err
	}
	if reg.Generation == "" {
		return "", fmt.Errorf("DRA driver %s at %s: generation is required: %w", reg.Driver, bounds.Quote(reg.Endpoint), errdefs.ErrInvalidArgument)
	}
	if reg.Endpoint == "" {
		return "", fmt.Errorf("DRA driver %s: endpoint is required: %w", reg.Driver, errdefs.ErrInvalidArgument)
	}
	service, err := kubeletrules.ChooseDRAService(reg.Services)
	if err != nil {
		return "", fmt.Errorf("invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: %w: %w", reg.Driver, bounds.Quote(reg.Endpoint), err, errdefs.ErrInvalidArgument)
	}
	return service, nil
}

// Register connects one instance of a driver and returns its state. The
// same driver, endpoint and generation again is a no-op that returns the
// instance as it is; a new generation of a registered endpoint replaces
// that instance. An endpoint outside the allowed directories, or with no
// file there, is refused as the Confiner refuses it
// (errdefs.ErrInvalidArgument); a socket that refuses connections is
// registered and redialled (its state says so). An endpoint registered
// for another driver with the same generation is errdefs.ErrAlreadyExists.
func (r *Registry) Register(ctx context.Context, reg Registration) (Instance, error) {
	service, err := ValidateRegistration(reg)
	if err != nil {
		return Instance{}, err
	}
	dialPath, id, err := r.confiner.Identify(reg.Endpoint)
	if err != nil {
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			err = fmt.Errorf("DRA driver %s: endpoint %s: %w: %w", reg.Driver, bounds.Quote(reg.Endpoint), err, errdefs.ErrUnavailable)
		}
		return Instance{}, err
	}
	if reg.SocketPath == "" {
		reg.SocketPath = reg.Endpoint
	}
	r.mu.Lock()
	st, done, err := r.registeredLocked(ctx, reg)
	r.mu.Unlock()
	if done {
		return st, err
	}
	// The client connection is built outside the lock: in a burst of
	// registrations it is the costliest step, and the others need not
	// wait for it.
	in, err := r.dial(reg, service, dialPath, id)
	if err != nil {
		return Instance{}, err
	}
	r.mu.Lock()
	if st, done, err := r.registeredLocked(ctx, reg); done {
		// Shutting down, or the same generation registered meanwhile.
		r.mu.Unlock()
		in.close()
		return st, err
	}
	replaced := r.removeLocked(r.findLocked(reg.Endpoint))
	r.drivers[reg.Driver] = append(r.drivers[reg.Driver], in)
	r.byEndpoint[in.endpoint] = in
	r.syncLocked(reg.Driver)
	// Connecting starts here and goes on after the answer, as in the
	// kubelet, which does not wait for it either: waiting held a reconciler
	// worker for a round trip to a driver that, in a burst, shares the
	// CPU with every other driver starting. The answer says where the
	// connection is (usually CONNECTING); ListDRADrivers follows it.
	// Started under the lock, so a Close that follows waits for its
	// goroutines (and one that came first left nothing to start).
	in.start(&r.wg)
	r.mu.Unlock()
	if replaced != nil {
		replaced.close()
		r.log.InfoContext(ctx, "DRA driver instance replaced by a new generation", "driver", replaced.driver, "endpoint", reg.Endpoint, "old_generation", replaced.generation, "generation", reg.Generation)
	}
	r.log.InfoContext(ctx, "DRA driver instance registered", "driver", reg.Driver, "endpoint", reg.Endpoint, "dial_path", dialPath, "service", service, "health_service", in.healthService, "generation", reg.Generation)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stateLocked(in), nil
}

// registeredLocked reports whether reg needs no new instance: the
// registry is shutting down (an error), the same generation of its
// endpoint is registered for it (its state), or for another driver (an
// error). Called with r.mu held.
func (r *Registry) registeredLocked(ctx context.Context, reg Registration) (Instance, bool, error) {
	if r.closed {
		return Instance{}, true, fmt.Errorf("DRA registry is shutting down: %w", errdefs.ErrUnavailable)
	}
	old := r.findLocked(reg.Endpoint)
	if old == nil || old.generation != reg.Generation {
		return Instance{}, false, nil
	}
	if old.driver != reg.Driver {
		return Instance{}, true, fmt.Errorf("endpoint %s with generation %s is registered for DRA driver %s, not %s: %w",
			bounds.Quote(reg.Endpoint), reg.Generation, old.driver, reg.Driver, errdefs.ErrAlreadyExists)
	}
	r.log.DebugContext(ctx, "DRA driver instance already registered with this generation", "driver", reg.Driver, "endpoint", reg.Endpoint, "generation", reg.Generation)
	return r.stateLocked(old), true, nil
}

// Deregister removes the instance of driver at endpoint registered with
// generation (required: a newer registration of the endpoint is left
// alone) and reports whether there was one.
func (r *Registry) Deregister(ctx context.Context, driver, endpoint, generation string) (bool, error) {
	if err := bounds.Name("DRA driver name", driver); err != nil {
		return false, err
	}
	if generation == "" {
		return false, fmt.Errorf("DRA driver %s at %s: generation is required: %w", driver, bounds.Quote(endpoint), errdefs.ErrInvalidArgument)
	}
	r.mu.Lock()
	in := r.findLocked(endpoint)
	if in == nil || in.driver != driver || in.generation != generation {
		r.mu.Unlock()
		return false, nil
	}
	r.removeLocked(in)
	r.mu.Unlock()
	in.close()
	r.log.InfoContext(ctx, "DRA driver instance deregistered", "driver", driver, "endpoint", endpoint, "generation", generation)
	return true, nil
}

// findLocked returns the instance at endpoint, of any driver.
func (r *Registry) findLocked(endpoint string) *instance { return r.byEndpoint[endpoint] }

// removeLocked takes in out of its driver's list and syncs the driver;
// nil is ignored. It returns in.
func (r *Registry) removeLocked(in *instance) *instance {
	if in == nil {
		return nil
	}
	list := r.drivers[in.driver]
	if i := slices.Index(list, in); i >= 0 {
		list = slices.Delete(list, i, i+1)
	}
	if len(list) == 0 {
		delete(r.drivers, in.driver)
	} else {
		r.drivers[in.driver] = list
	}
	if r.byEndpoint[in.endpoint] == in {
		delete(r.byEndpoint, in.endpoint)
	}
	in.removed = true
	r.syncLocked(in.driver)
	return in
}

// servingLocked returns the newest connected instance of driver, else its
// newest instance (as the kubelet), nil when there is none.
func (r *Registry) servingLocked(driver string) *instance {
	list := r.drivers[driver]
	for i := len(list) - 1; i >= 0; i-- {
		if list[i].connected {
			return list[i]
		}
	}
	if len(list) == 0 {
		return nil
	}
	return list[len(list)-1]
}

func (r *Registry) usableLocked(driver string) bool {
	return slices.ContainsFunc(r.drivers[driver], func(in *instance) bool { return in.connected })
}
