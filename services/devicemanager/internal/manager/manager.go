// Package manager is the devicemanager's core: device plugin endpoints and
// their ListAndWatch streams, the per-resource device sets, allocations, the
// grace period of stopped resources and the checkpoint.
//
// It knows nothing of nodeplug's own API (the gRPC adapter in package server
// converts); it talks to plugins with the upstream v1beta1 client. All
// methods are safe for concurrent use.
package manager

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/checkpoint"
)

// DefaultGracePeriod is how long a resource with no live endpoint keeps its
// capacity (the kubelet's endpointStopGracePeriod).
const DefaultGracePeriod = 5 * time.Minute

// Timeouts of the calls to plugins.
const (
	dialTimeout     = 10 * time.Second
	optionsTimeout  = 10 * time.Second
	preferredTimout = 10 * time.Second
	allocateTimeout = 30 * time.Second
	preStartTimeout = pluginapi.KubeletPreStartContainerRPCTimeoutInSecs * time.Second
	redialTimeout   = 3 * time.Second
)

// Config configures a Manager.
type Config struct {
	// DevicePluginsDir is <root>/device-plugins: the checkpoint lives there.
	DevicePluginsDir string
	// AllowedDirs confine the endpoints that may be dialled.
	AllowedDirs []string
	// GracePeriod defaults to DefaultGracePeriod.
	GracePeriod time.Duration
	Log         *slog.Logger
	// Registerer receives the metrics; nil means none are registered.
	Registerer prometheus.Registerer
}

// Manager is the device manager.
type Manager struct {
	log        *slog.Logger
	grace      time.Duration
	confiner   *unixsock.Confiner
	ckptPath   string
	instanceID string
	metrics    *metrics
	hub        *stream.Hub[Change]

	regLocks   keyedMutex // per endpoint path
	allocLocks keyedMutex // per pod/container

	mu        sync.Mutex
	resources map[string]*resource
	allocs    map[allocKey]*allocation
	// owners maps resource → device → the allocation holding it, committed
	// or reserved by an Allocate in flight.
	owners   map[string]map[string]allocKey
	seq      uint64
	revision uint64
	version  uint64 // bumped on every change the checkpoint holds
	closing  bool
	wake     chan struct{}
	dirty    chan struct{} // asks Run to write the checkpoint

	saveMu sync.Mutex
	saved  uint64

	wg sync.WaitGroup
}

type resource struct {
	name    string
	devices map[string]*device
	// ids caches the sorted keys of devices; nil after devices changed.
	ids []string
	// enc caches the checkpoint encoding; nil after any change.
	enc       []byte
	endpoints map[string]*endpoint // by endpoint path
	primary   *endpoint
	// stoppedAt is set while no endpoint is live: the grace period runs.
	stoppedAt time.Time
}

// sortedIDs returns the device IDs in sorted order. The slice is shared:
// callers must not change it.
func (r *resource) sortedIDs() []string {
	if r.ids == nil {
		r.ids = slices.Sorted(maps.Keys(r.devices))
	}
	return r.ids
}

type device struct {
	id      string
	healthy bool
	numa    []int64
}

type endpoint struct {
	resource   string
	path       string // as registered (absolute)
	dialPath   string // resolved inside the allowed directories
	socketPath string
	generation string
	regPath    RegistrationPath
	versions   []string
	opts       *pluginapi.DevicePluginOptions
	state      EndpointState
	seq        uint64
	registered time.Time
	stopped    time.Time

	conn      *grpc.ClientConn
	client    pluginapi.DevicePluginClient
	cancel    context.CancelFunc
	firstSpan trace.Span
	// closed: its end has been handled (replaced, deregistered or stopped);
	// its stream no longer changes anything.
	closed bool
}

type allocKey struct{ pod, container, resource string }

type allocation struct {
	key     allocKey
	ids     []string
	resp    *pluginapi.ContainerAllocateResponse
	traceID string
	at      time.Time
	enc     []byte // checkpoint encoding, made at the first write
}

var tracer = telemetry.Tracer("github.com/nodeplug/nodeplug/services/devicemanager")

// New returns a manager with no state; call Restore before serving.
func New(cfg Config) (*Manager, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.GracePeriod <= 0 {
		cfg.GracePeriod = DefaultGracePeriod
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
	return &Manager{
		log:        cfg.Log,
		grace:      cfg.GracePeriod,
		confiner:   conf,
		ckptPath:   checkpoint.Path(cfg.DevicePluginsDir),
		instanceID: uuid.NewString(),
		metrics:    newMetrics(cfg.Registerer),
		hub:        stream.NewHub[Change](0),
		resources:  map[string]*resource{},
		allocs:     map[allocKey]*allocation{},
		owners:     map[string]map[string]allocKey{},
		wake:       make(chan struct{}, 1),
		dirty:      make(chan struct{}, 1),
	}, nil
}

// InstanceID identifies this manager; it is new on every start.
func (m *Manager) InstanceID() string { return m.instanceID }

// GracePeriod returns the configured grace period.
func (m *Manager) GracePeriod() time.Duration { return m.grace }

// Register connects a device plugin endpoint: dial, GetDevicePluginOptions,
// open ListAndWatch. It returns once the stream is open; the first device
// update arrives asynchronously. A live endpoint registered again with the
// same generation is left as it is; a different generation replaces it.
func (m *Manager) Register(ctx context.Context, r Registration) error {
	m.metrics.registrations.WithLabelValues(r.Resource).Inc()
	if err := validateRegistration(r); err != nil {
		return err
	}
	dialPath, err := m.confiner.Resolve(r.Endpoint)
	if err != nil {
		return err
	}
	if r.Generation == "" {
		id, _, err := unixsock.Stat(dialPath)
		if err != nil {
			return fmt.Errorf("endpoint %s: %v: %w", r.Endpoint, err, errdefs.ErrInvalidArgument)
		}
		r.Generation = id.Generation()
	}
	if r.SocketPath == "" {
		r.SocketPath = r.Endpoint
	}
	unlock := m.regLocks.Lock(r.Endpoint)
	defer unlock()

	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return fmt.Errorf("devicemanager is shutting down: %w", errdefs.ErrUnavailable)
	}
	if res := m.resources[r.Resource]; res != nil {
		if ep := res.endpoints[r.Endpoint]; ep != nil && !ep.closed && ep.generation == r.Generation {
			m.mu.Unlock()
			m.log.DebugContext(ctx, "endpoint already connected with this generation", "resource", r.Resource, "endpoint", r.Endpoint, "generation", r.Generation)
			return nil
		}
	}
	m.mu.Unlock()

	ep := &endpoint{
		resource: r.Resource, path: r.Endpoint, dialPath: dialPath, socketPath: r.SocketPath,
		generation: r.Generation, regPath: r.Path, versions: slices.Clone(r.Versions),
	}
	lw, err := m.connect(ctx, ep)
	if err != nil {
		m.log.WarnContext(ctx, "device plugin registration failed", "resource", r.Resource, "endpoint", r.Endpoint, "error", err)
		return err
	}
	old, err := m.install(ep)
	if err != nil {
		return err
	}
	go m.run(ep, lw)
	m.log.InfoContext(ctx, "device plugin endpoint registered", "resource", r.Resource, "endpoint", r.Endpoint,
		"generation", r.Generation, "registration_path", string(r.Path), "replaced", old != nil,
		"pre_start_required", ep.opts.GetPreStartRequired(), "preferred_allocation", ep.opts.GetGetPreferredAllocationAvailable())
	// A registration is on disk before it is acknowledged, so that a
	// restart right after it still redials the endpoint (concurrent
	// registrations share writes).
	if err := m.persist(); err != nil {
		m.log.ErrorContext(ctx, "writing checkpoint after registration", "error", err)
	}
	return nil
}

// connect dials ep, gets its options and opens ListAndWatch. The stream
// carries the trace of ctx; a span "first ListAndWatch update" is started in
// ctx and ended when the first update arrives.
func (m *Manager) connect(ctx context.Context, ep *endpoint) (grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse], error) {
	cctx, span := tracer.Start(ctx, "connect "+ep.resource)
	defer span.End()
	conn, err := newPluginConn(ep.dialPath)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return nil, fmt.Errorf("failed to dial device plugin: %v: %w", err, errdefs.ErrUnavailable)
	}
	client := pluginapi.NewDevicePluginClient(conn)
	octx, ospan := tracer.Start(cctx, "GetDevicePluginOptions")
	octx, cancel := context.WithTimeout(octx, optionsTimeout)
	opts, err := client.GetDevicePluginOptions(octx, &pluginapi.Empty{})
	cancel()
	if err != nil {
		ospan.SetStatus(codes.Error, err.Error())
		ospan.End()
		span.SetStatus(codes.Error, err.Error())
		_ = conn.Close()
		return nil, fmt.Errorf("failed to get device plugin options for %s at %s: %s: %w", ep.resource, ep.path, status.Convert(err).Message(), pluginErrKind(err))
	}
	ospan.End()
	sctx, scancel := context.WithCancel(trace.ContextWithSpanContext(context.Background(), trace.SpanContextFromContext(cctx)))
	lw, err := client.ListAndWatch(sctx, &pluginapi.Empty{})
	if err != nil {
		scancel()
		_ = conn.Close()
		span.SetStatus(codes.Error, err.Error())
		return nil, fmt.Errorf("failed to open ListAndWatch of %s at %s: %s: %w", ep.resource, ep.path, status.Convert(err).Message(), pluginErrKind(err))
	}
	_, ep.firstSpan = tracer.Start(ctx, "first ListAndWatch update")
	ep.conn, ep.client, ep.opts, ep.cancel = conn, client, opts, scancel
	return lw, nil
}

// pluginErrKind classifies a plugin call error: transport problems are
// Unavailable, anything else the plugin said is Internal.
func pluginErrKind(err error) error {
	switch status.Code(err) {
	case grpccodes.Unavailable, grpccodes.DeadlineExceeded, grpccodes.Canceled:
		return errdefs.ErrUnavailable
	}
	return errdefs.ErrInternal
}

// install makes ep the primary endpoint of its resource (see installLocked)
// and accounts for its stream goroutine; it fails once the manager closes.
func (m *Manager) install(ep *endpoint) (*endpoint, error) {
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		ep.cancel()
		_ = ep.conn.Close()
		m.endFirstSpan(ep, errors.New("shutting down"))
		return nil, fmt.Errorf("devicemanager is shutting down: %w", errdefs.ErrUnavailable)
	}
	old := m.installLocked(ep, time.Now())
	m.wg.Add(1) // under the lock: Close sets closing before it waits
	m.mu.Unlock()
	if old != nil {
		old.cancel()
		_ = old.conn.Close()
	}
	return old, nil
}

// installLocked makes ep the primary endpoint of its resource and returns
// the endpoint it replaces on the same path, if any.
func (m *Manager) installLocked(ep *endpoint, now time.Time) *endpoint {
	res := m.resources[ep.resource]
	if res == nil {
		res = &resource{name: ep.resource, devices: map[string]*device{}, endpoints: map[string]*endpoint{}}
		m.resources[ep.resource] = res
	}
	old := res.endpoints[ep.path]
	if old != nil {
		if !old.closed {
			old.closed = true
			m.endFirstSpan(old, errors.New("replaced before its first update"))
		} else {
			old = nil // already cleaned up
		}
	}
	m.seq++
	ep.seq = m.seq
	if ep.registered.IsZero() {
		ep.registered = now
	}
	ep.state = StateConnecting
	res.endpoints[ep.path] = ep
	// Stopped endpoints are only kept while nothing is live.
	for p, e := range res.endpoints {
		if e != ep && e.state == StateStopped {
			delete(res.endpoints, p)
		}
	}
	res.primary = ep
	res.stoppedAt = time.Time{}
	m.changedLocked(res)
	return old
}

func (m *Manager) endFirstSpan(ep *endpoint, err error) {
	if ep.firstSpan == nil {
		return
	}
	if err != nil {
		ep.firstSpan.SetStatus(codes.Error, err.Error())
	}
	ep.firstSpan.End()
	ep.firstSpan = nil
}

// run receives ListAndWatch updates until the stream ends. The stream is
// never reopened (as the kubelet): the plugin must register again.
func (m *Manager) run(ep *endpoint, lw grpc.ServerStreamingClient[pluginapi.ListAndWatchResponse]) {
	defer m.wg.Done()
	for {
		resp, err := lw.Recv()
		if err != nil {
			m.streamEnded(ep, err)
			return
		}
		m.update(ep, resp.GetDevices())
	}
}

// update replaces the resource's device set with an update from ep (last
// writer wins).
func (m *Manager) update(ep *endpoint, devs []*pluginapi.Device) {
	m.mu.Lock()
	if ep.closed || m.closing {
		m.mu.Unlock()
		return
	}
	res := m.resources[ep.resource]
	first := ep.state == StateConnecting
	ep.state = StateLive
	res.devices = make(map[string]*device, len(devs))
	res.ids = nil
	for _, d := range devs {
		nd := &device{id: d.GetID(), healthy: d.GetHealth() == pluginapi.Healthy}
		for _, n := range d.GetTopology().GetNodes() {
			nd.numa = append(nd.numa, n.GetID())
		}
		res.devices[nd.id] = nd
	}
	if first {
		m.endFirstSpan(ep, nil)
	}
	m.changedLocked(res)
	healthy, total := res.healthyCount(), len(res.devices)
	m.mu.Unlock()
	m.log.Debug("device update", "resource", ep.resource, "endpoint", ep.path, "devices", total, "healthy", healthy, "first", first)
	m.persistSoon()
}

func (r *resource) healthyCount() int {
	n := 0
	for _, d := range r.devices {
		if d.healthy {
			n++
		}
	}
	return n
}

func (m *Manager) streamEnded(ep *endpoint, err error) {
	m.mu.Lock()
	if ep.closed || m.closing {
		m.mu.Unlock()
		return
	}
	m.log.Warn("ListAndWatch ended unexpectedly", "resource", ep.resource, "endpoint", ep.path, "error", err)
	m.stopLocked(ep, time.Now(), fmt.Errorf("ListAndWatch ended: %w", err))
	m.mu.Unlock()
	m.persistSoon()
}

// stopLocked handles the end of ep: with other endpoints still there a
// survivor becomes primary; as the last one it stays, stopped, with every
// device unhealthy (capacity kept) until the grace period ends.
func (m *Manager) stopLocked(ep *endpoint, now time.Time, why error) {
	ep.closed = true
	ep.cancel()
	conn := ep.conn
	m.wg.Add(1)
	go func() { defer m.wg.Done(); _ = conn.Close() }()
	m.endFirstSpan(ep, why)
	ep.state = StateStopped
	ep.stopped = now
	res := m.resources[ep.resource]
	if res == nil || res.endpoints[ep.path] != ep {
		return
	}
	var survivor *endpoint
	for _, e := range res.endpoints {
		if e != ep && !e.closed && (survivor == nil || e.seq > survivor.seq) {
			survivor = e
		}
	}
	if survivor != nil {
		delete(res.endpoints, ep.path)
		if res.primary == ep || res.primary == nil || res.primary.closed {
			res.primary = survivor
			m.log.Info("endpoint promoted to primary", "resource", res.name, "endpoint", survivor.path)
		}
	} else {
		for p, e := range res.endpoints {
			if e != ep {
				delete(res.endpoints, p)
			}
		}
		res.primary = ep
		for _, d := range res.devices {
			d.healthy = false
		}
		res.stoppedAt = now
		m.log.Warn("resource has no live endpoint; devices unhealthy until the grace period ends",
			"resource", res.name, "grace_deadline", now.Add(m.grace))
		m.poke()
	}
	m.changedLocked(res)
}

// persistBatch is how long Run gathers changes before a write they ask for
// with persistSoon.
const persistBatch = 10 * time.Millisecond

// persistSoon asks Run to write the checkpoint. Device updates, stopped
// endpoints, deregistrations and expiries use it, so they never wait for
// the disk: writes are gathered, and a registration, an Allocate or a
// Release (which write before they return) or Close writes everything
// pending too.
func (m *Manager) persistSoon() {
	select {
	case m.dirty <- struct{}{}:
	default:
	}
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Deregister removes the endpoint of resource at path; with a generation
// only if it matches. It reports whether an endpoint was removed.
func (m *Manager) Deregister(ctx context.Context, resourceName, path, generation string) (bool, error) {
	if resourceName == "" || path == "" {
		return false, fmt.Errorf("resource name and endpoint are required: %w", errdefs.ErrInvalidArgument)
	}
	unlock := m.regLocks.Lock(path)
	defer unlock()
	m.mu.Lock()
	if m.closing {
		m.mu.Unlock()
		return false, fmt.Errorf("devicemanager is shutting down: %w", errdefs.ErrUnavailable)
	}
	res := m.resources[resourceName]
	var ep *endpoint
	if res != nil {
		ep = res.endpoints[path]
	}
	if ep == nil || ep.closed || (generation != "" && ep.generation != generation) {
		m.mu.Unlock()
		return false, nil
	}
	m.stopLocked(ep, time.Now(), errors.New("deregistered"))
	m.mu.Unlock()
	m.log.InfoContext(ctx, "device plugin endpoint deregistered", "resource", resourceName, "endpoint", path, "generation", ep.generation)
	m.persistSoon()
	return true, nil
}

// Run removes resources whose grace period ended and writes the checkpoint
// when asked (persistSoon), until ctx ends.
func (m *Manager) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		m.mu.Lock()
		next, removed := m.expireLocked(time.Now())
		m.mu.Unlock()
		if removed {
			m.persistSoon()
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), time.Millisecond)
		}
		timer.Reset(wait)
	writes:
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-m.wake:
				break writes
			case <-timer.C:
				break writes
			case <-m.dirty:
				// Gather the changes of a burst (many plugins registering
				// at once) into one write.
				select {
				case <-ctx.Done():
				case <-time.After(persistBatch):
				}
				if err := m.persist(); err != nil {
					m.log.Error("writing checkpoint", "error", err)
				}
			}
		}
	}
}

// expireLocked removes resources whose grace period ended and returns the
// next deadline.
func (m *Manager) expireLocked(now time.Time) (next time.Time, removed bool) {
	for name, res := range m.resources {
		if res.stoppedAt.IsZero() {
			continue
		}
		deadline := res.stoppedAt.Add(m.grace)
		if !now.Before(deadline) {
			m.log.Info("resource removed: grace period ended with no live endpoint", "resource", name)
			delete(m.resources, name)
			m.metrics.forget(name)
			m.publishLocked(true, m.viewLocked(res))
			m.version++
			removed = true
			continue
		}
		if next.IsZero() || deadline.Before(next) {
			next = deadline
		}
	}
	return next, removed
}

// changedLocked records a change of res: metrics, the Watch stream and the
// checkpoint version.
func (m *Manager) changedLocked(res *resource) {
	m.version++
	res.enc = nil
	v := m.viewLocked(res)
	m.metrics.devices.WithLabelValues(res.name, "healthy").Set(float64(len(v.Healthy)))
	m.metrics.devices.WithLabelValues(res.name, "unhealthy").Set(float64(len(v.Unhealthy)))
	m.publishLocked(false, v)
}

func (m *Manager) publishLocked(removed bool, r ResourceInfo) {
	m.revision++
	m.hub.Publish(Change{Removed: removed, Resource: r, Revision: m.revision})
}

func (m *Manager) viewLocked(res *resource) ResourceInfo {
	v := ResourceInfo{Name: res.name, Capacity: int64(len(res.devices))}
	owners := m.owners[res.name]
	for _, id := range res.sortedIDs() {
		d := res.devices[id]
		if d.healthy {
			v.Healthy = append(v.Healthy, id)
			if _, taken := owners[id]; !taken {
				v.Free++
			}
		} else {
			v.Unhealthy = append(v.Unhealthy, id)
		}
	}
	v.Allocatable = int64(len(v.Healthy))
	v.Allocated = slices.Sorted(maps.Keys(owners))
	eps := slices.SortedFunc(maps.Values(res.endpoints), func(a, b *endpoint) int { return cmp.Compare(a.seq, b.seq) })
	for _, e := range eps {
		v.Endpoints = append(v.Endpoints, EndpointInfo{
			Endpoint: e.path, SocketPath: e.socketPath, Generation: e.generation, Path: e.regPath,
			State: e.state, Versions: slices.Clone(e.versions), Primary: e == res.primary,
			PreStartRequired:    e.opts.GetPreStartRequired(),
			PreferredAllocation: e.opts.GetGetPreferredAllocationAvailable(),
			Registered:          e.registered, Stopped: e.stopped,
		})
	}
	if !res.stoppedAt.IsZero() {
		v.GraceDeadline = res.stoppedAt.Add(m.grace)
	}
	return v
}

// ListResources returns every resource, sorted by name.
func (m *Manager) ListResources() []ResourceInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ResourceInfo
	for _, name := range slices.Sorted(maps.Keys(m.resources)) {
		out = append(out, m.viewLocked(m.resources[name]))
	}
	return out
}

// Watch returns the current resources as a snapshot (at revision rev) and
// a subscription to every later change, consistently.
func (m *Manager) Watch() (snapshot []Change, sub *stream.Subscription[Change], rev uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	sub = m.hub.Subscribe()
	for _, name := range slices.Sorted(maps.Keys(m.resources)) {
		snapshot = append(snapshot, Change{Resource: m.viewLocked(m.resources[name]), Revision: m.revision})
	}
	return snapshot, sub, m.revision
}

// LiveEndpointPaths returns the resolved socket paths of endpoints that are
// not stopped.
func (m *Manager) LiveEndpointPaths() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]bool{}
	for _, res := range m.resources {
		for _, e := range res.endpoints {
			if !e.closed {
				out[e.dialPath] = true
				out[e.path] = true
			}
		}
	}
	return out
}

// Close stops every stream and connection without deregistering anything,
// and writes the checkpoint a last time.
func (m *Manager) Close() error {
	m.mu.Lock()
	m.closing = true
	var eps []*endpoint
	for _, res := range m.resources {
		for _, e := range res.endpoints {
			if e.cancel != nil {
				eps = append(eps, e)
			}
		}
	}
	m.version++
	m.mu.Unlock()
	for _, e := range eps {
		e.cancel()
		_ = e.conn.Close()
	}
	m.wg.Wait()
	m.hub.Close(fmt.Errorf("devicemanager shutting down: %w", errdefs.ErrUnavailable))
	return m.persist()
}
