// Package manager is the devicemanager's core. It ties together the
// connections to device plugins (package endpoint), the choice of devices
// (package allocator) and the saved state (package store).
//
// One state core (core.go, type core) owns everything they share: the
// resources (their endpoints and which one is primary, the device sets —
// the latest ListAndWatch update of any live endpoint, last writer wins —
// and the grace period of resources with no live endpoint), the
// allocations and the reservations of the Allocate calls in flight
// (ledger.go), the Watch hub that publishes every change, and the staging
// of all of it to the store, as typed journal records (journalKey). Every
// change is one method of the core under its mutex: core_endpoints.go for
// the endpoints, core_alloc.go for the allocations. The rest are the
// core's clients and do the I/O with no lock of the core held: the endpoint
// life (manager.go: register, dial, streams, deregister, close; identity.go
// for an endpoint's socket identity; persist.go for restore and redial),
// the allocation flow (allocate.go: the allocator's choice from a snapshot
// the core gives it, the plugin calls, rollback), start-up (startup.go)
// and the background work (run.go: grace periods, gathered writes, the
// memory give-back). A second kind of state (prepared DRA claims) is a new
// record kind of the same core, not a second hub.
//
// Concurrency and ordering: every method of Manager is safe for concurrent
// use. Registrations and deregistrations of one endpoint path run one at a
// time, and Allocate calls of one container. Locks are taken in this order
// only: an endpoint path's or a container's lock, the write lock of the
// store (core.saveMu), the core's mutex. Changes reach Watch subscribers
// in the order they happen, each with a revision one higher than the last.
//
// Errors wrap errdefs sentinels; the package knows nothing of gRPC status
// codes or of nodeplug's own API (package server converts).
package manager

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/memory"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/endpoint"
	"github.com/nodeplug/nodeplug/services/internal/keylock"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// DefaultGracePeriod is how long a resource with no live endpoint keeps its
// capacity (the kubelet's endpointStopGracePeriod).
const DefaultGracePeriod = 5 * time.Minute

// redialTimeout bounds the redial of one recorded endpoint at start.
const redialTimeout = 3 * time.Second

var tracer = telemetry.Tracer("github.com/nodeplug/nodeplug/services/devicemanager")

var errShuttingDown = fmt.Errorf("devicemanager is shutting down: %w", errdefs.ErrUnavailable)

// Config configures a Manager.
type Config struct {
	// DevicePluginsDir is <root>/device-plugins: kubelet.sock and the
	// legacy plugins' sockets live there.
	DevicePluginsDir string
	// AllowedDirs confine the endpoints that may be dialled (default:
	// DevicePluginsDir).
	AllowedDirs []string
	// GracePeriod defaults to DefaultGracePeriod.
	GracePeriod time.Duration
	// EndpointWait defaults to EndpointWait.
	EndpointWait time.Duration
	// Store keeps the state durable; required.
	Store store.Store
	Log   *slog.Logger
	// Registerer receives the metrics; nil means none are registered.
	Registerer prometheus.Registerer
	// WatchLimits bound the Watch subscribers (the WatchResources
	// streams): how many may be open, and the bytes of changes they hold
	// before their clients take them (DESIGN "Bounds"). Zero fields take
	// the stream package's defaults.
	WatchLimits stream.Limits
	// GiveBack says when the memory of a burst of endpoint arrivals or
	// departures is returned to the OS; zero fields take its defaults.
	GiveBack GiveBack
	// Specs keeps each allocated container's CDI spec (start.go); nil
	// keeps none.
	Specs ContainerSpecs
}

// Manager is the device manager: the state core (core.go), which it
// embeds for its read views (ListResources, Watch, ListDevices,
// ListAllocations), and its two clients: the endpoint life (this file:
// register, connect, the streams, deregister, close) and the allocation
// flow (allocate.go).
type Manager struct {
	*core

	// endpointWait: how long a registration waits for its endpoint file.
	endpointWait time.Duration
	confiner     *unixsock.Confiner
	instanceID   string

	regLocks   keylock.Mutex // per endpoint path
	containers keylock.Mutex // per pod and container (allocate.go, start.go)
	specs      ContainerSpecs

	// giver gives the memory of a settled burst of endpoint changes back
	// to the OS, the core's compaction its hook (see GiveBack).
	giver *memory.Giver

	// updates carries what the endpoints' streams receive to
	// applyUpdates, which applies them one at a time (see run).
	updates      chan streamItem
	stopApplying context.CancelFunc
	applying     sync.WaitGroup
}

// New returns a manager with no state; Open is the usual way to get one
// (it also restores the saved state). Close releases it.
func New(cfg Config) (*Manager, error) {
	if cfg.Store == nil {
		return nil, fmt.Errorf("devicemanager: no store configured: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.GracePeriod <= 0 {
		cfg.GracePeriod = DefaultGracePeriod
	}
	if cfg.EndpointWait <= 0 {
		cfg.EndpointWait = EndpointWait
	}
	dirs := cfg.AllowedDirs
	if len(dirs) == 0 {
		dirs = []string{cfg.DevicePluginsDir}
	}
	conf, err := unixsock.NewConfiner(dirs)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.DevicePluginsDir, 0o750); err != nil {
		return nil, fmt.Errorf("create %s: %w", cfg.DevicePluginsDir, err)
	}
	m := &Manager{
		core:         newCore(cfg),
		endpointWait: cfg.EndpointWait,
		confiner:     conf,
		instanceID:   uuid.NewString(),
		specs:        cfg.Specs,
		updates:      make(chan streamItem),
	}
	m.giver = memory.NewGiver(memory.GiverOptions{
		Hook: m.compact, Metrics: "nodeplug_devicemanager_memory", Burst: "endpoint arrivals or departures",
		Registerer: cfg.Registerer, Log: cfg.Log,
	})
	actx, cancel := context.WithCancel(context.Background())
	m.stopApplying = cancel
	m.applying.Add(1)
	go func() {
		defer m.applying.Done()
		m.applyUpdates(actx)
	}()
	return m, nil
}

// InstanceID identifies this manager; it is new on every start.
func (m *Manager) InstanceID() string { return m.instanceID }

// GracePeriod returns the configured grace period.
func (m *Manager) GracePeriod() time.Duration { return m.grace }

// Register connects a device plugin endpoint: dial, GetDevicePluginOptions,
// open ListAndWatch. An endpoint file that does not exist yet is waited for,
// as the kubelet's dial does, up to EndpointWait (or until ctx ends); only
// this registration waits. It returns once the stream is open and the
// registration is durable; the first device update arrives
// asynchronously. A registration that cannot be saved fails with
// errdefs.ErrInternal (see saved). A live endpoint registered again with
// the same generation is left as it is; a different generation replaces
// it, keeping the resource's devices until the new endpoint's first
// update.
//
// An endpoint is its socket's (device, inode), not its path (DESIGN
// "Identity"): another path to a live endpoint's socket (a hard link, an
// allowed symlink) is that endpoint. One live endpoint serves one
// resource: naming an endpoint (its path, or another path to its socket)
// that is live under another resource fails with an
// *EndpointConflictError (errdefs.ErrAlreadyExists); under the same
// resource it is a re-registration of that endpoint. The socket checked
// is the socket connected, at every dial (unixsock.Confiner.Dialer).
//
// The registration is counted (kubelet_device_plugin_registration_total)
// once it succeeds, so that metric labels only ever name registered
// resources.
func (m *Manager) Register(ctx context.Context, r Registration) error {
	if err := ValidateRegistration(r); err != nil {
		return err
	}
	if _, err := m.resolveEndpoint(ctx, r.Endpoint); err != nil {
		return err
	}
	// The socket there now, checked again: its identity is the endpoint's,
	// and the only socket its connection will reach (see connect).
	dialPath, id, err := m.confiner.Identify(r.Endpoint)
	if err != nil {
		m.log.WarnContext(ctx, "device plugin registration refused", "resource", r.Resource, "endpoint", r.Endpoint, "error", err)
		return err
	}
	if r.Generation == "" {
		r.Generation = id.Generation()
	}
	if r.SocketPath == "" {
		r.SocketPath = r.Endpoint
	}
	unlock := m.regLocks.Lock(r.Endpoint)
	defer unlock()

	live, err := m.admit(r, id)
	switch {
	case errors.Is(err, errShuttingDown):
		return err
	case err != nil:
		m.log.WarnContext(ctx, "device plugin registration refused", "resource", r.Resource, "endpoint", r.Endpoint, "dial_path", dialPath, "error", err)
		return err
	case live != nil:
		m.log.DebugContext(ctx, "endpoint already connected with this generation", "resource", r.Resource, "endpoint", r.Endpoint, "connected_as", live.path, "generation", r.Generation)
		// Already live, but perhaps not yet on disk: the attempt that
		// installed it may have failed to save it (this is its retry),
		// or may still be saving it.
		if err := m.saved(ctx); err != nil {
			return err
		}
		m.metrics.registrations.WithLabelValues(r.Resource).Inc()
		return nil
	}

	e := &entry{
		resource: r.Resource, path: r.Endpoint, dialPath: dialPath, id: id, socketPath: r.SocketPath,
		generation: r.Generation, regPath: r.Path, versions: slices.Clone(r.Versions),
	}
	if err := m.connect(ctx, e); err != nil {
		m.log.WarnContext(ctx, "device plugin registration failed", "resource", r.Resource, "endpoint", r.Endpoint, "dial_path", dialPath, "error", err)
		return err
	}
	old, err := m.install(e)
	if err != nil {
		m.log.WarnContext(ctx, "device plugin registration refused", "resource", r.Resource, "endpoint", r.Endpoint, "dial_path", dialPath, "error", err)
		return err
	}
	m.log.InfoContext(ctx, "device plugin endpoint registered", "resource", r.Resource, "endpoint", r.Endpoint, "dial_path", dialPath,
		"generation", r.Generation, "registration_path", string(r.Path), "replaced", old != nil,
		"pre_start_required", e.opts.PreStartRequired, "preferred_allocation", e.opts.PreferredAllocation)
	// A registration is on disk before it is acknowledged, so that a
	// restart right after it still redials the endpoint (concurrent
	// registrations share writes).
	if err := m.saved(ctx); err != nil {
		return err
	}
	m.metrics.registrations.WithLabelValues(r.Resource).Inc()
	return nil
}

// saved makes every change so far durable, for a registration about to be
// acknowledged. When the checkpoint cannot be written the registration
// fails, though its endpoint stays live (its devices are served; tearing
// it down would take them from running pods): the caller retries, and a
// retry with the same generation succeeds once the write does.
func (m *Manager) saved(ctx context.Context) error {
	if err := m.persist(); err != nil {
		m.log.ErrorContext(ctx, "registration not saved: the checkpoint cannot be written", "error", err)
		return fmt.Errorf("registration not saved: %v: %w", err, errdefs.ErrInternal)
	}
	return nil
}

// EndpointWait is how long Register waits for an endpoint socket that does
// not exist yet: the kubelet's dial timeout. A plugin may create its
// registration socket (or call Register) before its endpoint socket.
const EndpointWait = 10 * time.Second

// resolveEndpoint resolves path inside the allowed directories (see
// unixsock.Confiner.WaitResolve). While path, inside them, does not exist
// yet, it waits for it, up to m.endpointWait or until ctx ends; only the
// calling registration waits.
func (m *Manager) resolveEndpoint(ctx context.Context, path string) (string, error) {
	if m.confiner.MayAppear(path) {
		m.log.InfoContext(ctx, "device plugin endpoint does not exist yet; waiting for it", "endpoint", path, "wait", m.endpointWait)
	}
	wctx, cancel := context.WithTimeout(ctx, m.endpointWait)
	defer cancel()
	dialPath, err := m.confiner.WaitResolve(wctx, path, nil)
	switch {
	case err == nil || !errors.Is(err, errdefs.ErrUnavailable):
		return dialPath, err
	case ctx.Err() != nil:
		return "", fmt.Errorf("waiting for endpoint %s to appear: %w", bounds.Quote(path), ctx.Err())
	}
	return "", kubeletrules.New("failed to dial device plugin: "+context.DeadlineExceeded.Error(),
		fmt.Sprintf("failed to dial device plugin: endpoint %s did not appear within %v", bounds.Quote(path), m.endpointWait),
		errdefs.ErrUnavailable)
}

// connect opens e's connection (see endpoint.Connect). Every dial of it,
// the first and each reconnect, checks e.path inside the allowed
// directories and connects only e's socket (e.id).
func (m *Manager) connect(ctx context.Context, e *entry) error {
	conn, err := endpoint.Connect(ctx, e.resource, e.path, m.confiner.Dialer(e.path, unixsock.NewPin(e.id)))
	if err != nil {
		return err
	}
	e.conn, e.opts = conn, conn.Options()
	return nil
}

// install makes e, connected, the primary endpoint of its resource (see
// core.install) and starts receiving its stream.
func (m *Manager) install(e *entry) (*entry, error) {
	old, err := m.core.install(e)
	if err != nil {
		return nil, err
	}
	go m.run(e)
	return old, nil
}

// streamItem is what an endpoint's stream delivered: a device list, or
// its end (ended, with why).
type streamItem struct {
	e     *entry
	devs  []endpoint.Device
	ended bool
	err   error
}

// run receives e's ListAndWatch updates until the stream ends, and hands
// each, then the end, to applyUpdates. The stream is never reopened (as the
// kubelet): the plugin must register again.
//
// The goroutine lives as long as the plugin and only receives: applying an
// update (the views, the metrics, the Watch hub, the log) is a deep call
// path, and a stack grown by it once would be kept, per plugin, for the
// plugin's whole life. The hand-off is unbuffered, so the next update is
// not received before the last one was taken, and each stream's items are
// applied in the order they arrived.
func (m *Manager) run(e *entry) {
	defer m.wg.Done()
	err := e.conn.Run(func(devs []endpoint.Device) { m.updates <- streamItem{e: e, devs: devs} })
	// Close stops applyUpdates only once every stream goroutine is done,
	// so these sends always find it.
	m.updates <- streamItem{e: e, ended: true, err: err}
}

// applyUpdates applies what the streams deliver, one item at a time, until
// ctx ends (Close, once every stream goroutine has returned).
func (m *Manager) applyUpdates(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case it := <-m.updates:
			if it.ended {
				m.endStream(it.e, it.err)
			} else {
				m.update(it.e, it.devs)
			}
		}
	}
}

// update replaces the resource's device set with an update from e (last
// writer wins). Devices whose IDs break the bounds (bounds.DeviceID) are
// dropped, with a warning.
func (m *Manager) update(e *entry, devs []endpoint.Device) {
	m.applyDevices(e, m.validDevices(e, devs))
}

// validDevices returns the devices of devs whose IDs are within the bounds,
// and logs those it drops.
func (m *Manager) validDevices(e *entry, devs []endpoint.Device) []endpoint.Device {
	var dropped int
	var first error
	out := devs[:0:0]
	for _, d := range devs {
		if err := bounds.DeviceID(d.ID); err != nil {
			if dropped == 0 {
				first = err
			}
			dropped++
			continue
		}
		out = append(out, d)
	}
	if dropped > 0 {
		m.log.Warn("device plugin sent invalid device IDs; those devices are ignored", "resource", e.resource, "endpoint", e.path,
			"dropped", dropped, "kept", len(out), "first_error", first)
	}
	return out
}

// Deregister removes the endpoint of resource at path if its generation
// (or, for a legacy registration, its socket identity) is generation. It
// reports whether an endpoint was removed. Every argument is required: an
// empty generation would match an endpoint registered since.
func (m *Manager) Deregister(ctx context.Context, resourceName, path, generation string) (bool, error) {
	if resourceName == "" || path == "" || generation == "" {
		return false, fmt.Errorf("resource name, endpoint and generation are required to deregister: %w", errdefs.ErrInvalidArgument)
	}
	if err := bounds.Name("resource name", resourceName); err != nil {
		return false, err
	}
	if err := socketPath("endpoint", path, false); err != nil {
		return false, err
	}
	if err := bounds.CheckText("generation", generation, maxGeneration); err != nil {
		return false, err
	}
	unlock := m.regLocks.Lock(path)
	defer unlock()
	e, err := m.deregister(resourceName, path, generation)
	if err != nil || e == nil {
		return false, err
	}
	m.log.InfoContext(ctx, "device plugin endpoint deregistered", "resource", resourceName, "endpoint", path, "generation", e.generation)
	m.persistSoon()
	return true, nil
}

// Close stops every stream and connection without deregistering anything,
// ends the Watch streams, and makes the state durable a last time. Run
// calls it when its context ends.
func (m *Manager) Close() error {
	conns, first := m.shutdown()
	if !first {
		return nil
	}
	for _, c := range conns {
		c.Close(errShuttingDown)
	}
	m.wg.Wait()
	m.stopApplying()
	m.applying.Wait()
	m.hub.Close(fmt.Errorf("devicemanager shutting down: %w", errdefs.ErrUnavailable))
	if err := m.persist(); err != nil {
		return err
	}
	return m.store.Flush()
}
