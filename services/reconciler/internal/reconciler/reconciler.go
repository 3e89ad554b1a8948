// Package reconciler is the plugin manager's control loop: it drives the
// actual state of the world (registered plugins) towards the desired state
// (sockets the watcher reports), as the kubelet's reconciler does, but
// event-driven: a change of the desired state wakes a pass at once, a retry
// wakes one when its backoff ends, and a periodic resync is only a safety
// net.
//
// A pass first unregisters what is gone or has a new generation, then
// re-registers what a handler asked for (a restarted devicemanager), then
// registers what is missing. Each operation runs in the executor: one per
// socket path at a time, with backoff per socket generation.
package reconciler

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/clock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
)

// Defaults.
const (
	DefaultResyncPeriod   = 5 * time.Minute
	DefaultGetInfoTimeout = time.Second     // the kubelet's
	DefaultNotifyTimeout  = 5 * time.Second // the kubelet's
)

// Sweeper is implemented by handlers that keep registrations outside this
// process (the devicemanager's endpoints). After the first snapshot, after
// a failed deregistration, and after a handler reports that its downstream
// restarted, the reconciler asks it to drop registrations that keep
// rejects: keep holds for a socket path and generation that is in the
// desired state.
type Sweeper interface {
	Sweep(ctx context.Context, keep func(socketPath, generation string) bool) (int, error)
}

// Options configure a Reconciler.
type Options struct {
	// Handlers by plugin type (DevicePlugin, CSIPlugin, DRAPlugin).
	Handlers map[string]cache.Handler
	Log      *slog.Logger
	// Clock drives backoff and resync; the wall clock when nil.
	Clock clock.Clock
	// ResyncPeriod is the safety-net pass interval (DefaultResyncPeriod
	// when 0).
	ResyncPeriod time.Duration
	// GetInfoTimeout and NotifyTimeout bound the calls to the plugin.
	GetInfoTimeout time.Duration
	NotifyTimeout  time.Duration
	// MaxParallel bounds operations executing at once (see executor).
	MaxParallel int
	// Confiner, when set, refuses plugin endpoints outside the allowed
	// directories (reported to the plugin as a validation failure).
	Confiner *unixsock.Confiner
}

// Reconciler owns the DSW, the ASW and the operations between them. Its
// methods are safe for concurrent use.
type Reconciler struct {
	dsw      cache.DesiredStateOfWorld
	asw      cache.ActualStateOfWorld
	handlers map[string]cache.Handler
	log      *slog.Logger
	clock    clock.Clock
	exec     *executor.Executor
	opts     Options
	metrics  *metrics
	instance string

	wake chan struct{}
	bg   sync.WaitGroup

	mu           sync.Mutex
	status       map[string]*PluginStatus
	hub          *stream.Hub[Change]
	revision     uint64
	reregister   map[string]bool
	deleteTrace  map[string]map[string]string
	needSweep    bool
	sweepFailing bool
	// What the next pass looks at: every socket (full) or only the dirty
	// ones, so a burst of N events costs O(N), not O(N²).
	full   bool
	dirty  map[string]struct{}
	synced bool // a first snapshot arrived
	// syncedCh is closed when the first snapshot arrives.
	syncedCh chan struct{}
}

// New returns a reconciler with empty caches.
func New(o Options) *Reconciler {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.ResyncPeriod <= 0 {
		o.ResyncPeriod = DefaultResyncPeriod
	}
	if o.GetInfoTimeout <= 0 {
		o.GetInfoTimeout = DefaultGetInfoTimeout
	}
	if o.NotifyTimeout <= 0 {
		o.NotifyTimeout = DefaultNotifyTimeout
	}
	r := &Reconciler{
		dsw:         cache.NewDesiredStateOfWorld(),
		asw:         cache.NewActualStateOfWorld(),
		handlers:    o.Handlers,
		log:         o.Log,
		clock:       o.Clock,
		opts:        o,
		instance:    uuid.NewString(),
		wake:        make(chan struct{}, 1),
		status:      map[string]*PluginStatus{},
		hub:         stream.NewHub[Change](0),
		reregister:  map[string]bool{},
		deleteTrace: map[string]map[string]string{},
		dirty:       map[string]struct{}{},
		syncedCh:    make(chan struct{}),
	}
	r.metrics = newMetrics(r)
	r.exec = executor.New(executor.Options{Clock: o.Clock, Log: o.Log, MaxParallel: o.MaxParallel, Due: r.wakePath})
	return r
}

// DSW returns the desired state of the world.
func (r *Reconciler) DSW() cache.DesiredStateOfWorld { return r.dsw }

// ASW returns the actual state of the world.
func (r *Reconciler) ASW() cache.ActualStateOfWorld { return r.asw }

// InstanceID identifies this reconciler process.
func (r *Reconciler) InstanceID() string { return r.instance }

// Synced reports whether a first snapshot of the sockets arrived.
func (r *Reconciler) Synced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced
}

// WaitSynced waits until the first snapshot of the sockets arrived: from
// then on, a socket created is a live event to the reconciler.
func (r *Reconciler) WaitSynced(ctx context.Context) error {
	select {
	case <-r.syncedCh:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wake asks for a reconcile pass over every socket. It never blocks.
func (r *Reconciler) Wake() {
	r.mu.Lock()
	r.full = true
	r.mu.Unlock()
	r.signal()
}

// wakePath asks for a pass over one socket: its desired state changed, or
// its operation ended, or its backoff did.
func (r *Reconciler) wakePath(path string) {
	r.mu.Lock()
	r.dirty[path] = struct{}{}
	r.mu.Unlock()
	r.signal()
}

func (r *Reconciler) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// ReplaceSockets makes the DSW exactly sockets (a new watcher stream's
// snapshot): sockets with an unchanged generation are left alone, so a
// watcher restart causes no re-registration.
func (r *Reconciler) ReplaceSockets(sockets []cache.Socket) {
	added, changed, removed := r.dsw.Replace(sockets)
	r.mu.Lock()
	first := !r.synced
	r.synced = true
	if first {
		close(r.syncedCh)
	}
	if first {
		r.needSweep = true
	}
	r.mu.Unlock()
	r.log.Info("desired state replaced from snapshot", "sockets", len(sockets), "added", added, "changed", changed, "removed", removed)
	r.Wake()
}

// SocketCreated records a live CREATED event.
func (r *Reconciler) SocketCreated(s cache.Socket) {
	changed, err := r.dsw.AddOrUpdate(s)
	if err != nil {
		r.log.Warn("ignoring socket event", "error", err)
		return
	}
	if changed {
		r.wakePath(s.Path)
	}
}

// SocketDeleted records a live DELETED event. generation, when set, must
// match the DSW's (a newer socket at the path stays). traceContext is the
// event's, continued by the unregister operation.
func (r *Reconciler) SocketDeleted(path, generation string, traceContext map[string]string) {
	if !r.dsw.Remove(path, generation) {
		return
	}
	if len(traceContext) > 0 {
		r.mu.Lock()
		r.deleteTrace[path] = traceContext
		r.mu.Unlock()
	}
	r.wakePath(path)
}

// Reregister asks for every registered plugin of type typ to be registered
// with its handler again (its downstream restarted and lost them), and for
// a sweep of registrations whose sockets are gone.
func (r *Reconciler) Reregister(typ string) {
	r.mu.Lock()
	for _, p := range r.asw.List() {
		if p.Type == typ {
			r.reregister[p.SocketPath] = true
		}
	}
	r.needSweep = true
	r.mu.Unlock()
	r.Wake()
}

// Run reconciles until ctx ends, then waits for running operations.
func (r *Reconciler) Run(ctx context.Context) error {
	var timerMu sync.Mutex
	var timer clock.Timer
	var arm func()
	arm = func() {
		timerMu.Lock()
		defer timerMu.Unlock()
		if ctx.Err() != nil {
			return
		}
		timer = r.clock.AfterFunc(r.opts.ResyncPeriod, func() {
			r.log.Debug("periodic resync")
			r.Wake()
			arm()
		})
	}
	arm()
	defer func() {
		timerMu.Lock()
		if timer != nil {
			timer.Stop()
		}
		timerMu.Unlock()
		r.exec.Wait()
		r.bg.Wait()
		r.hub.Close(nil)
	}()
	for {
		r.reconcile(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		}
	}
}

func (r *Reconciler) reconcile(ctx context.Context) {
	r.mu.Lock()
	full, dirty := r.full, r.dirty
	r.full, r.dirty = false, map[string]struct{}{}
	r.mu.Unlock()
	if full {
		// Every socket the caches, the statuses or a re-registration know.
		for _, p := range r.asw.List() {
			dirty[p.SocketPath] = struct{}{}
		}
		for _, d := range r.dsw.List() {
			dirty[d.Path] = struct{}{}
		}
		r.mu.Lock()
		for path := range r.status {
			dirty[path] = struct{}{}
		}
		for path := range r.reregister {
			dirty[path] = struct{}{}
		}
		r.mu.Unlock()
	}
	for path := range dirty {
		r.reconcilePath(ctx, path)
	}
	r.mu.Lock()
	sweep := r.needSweep && r.synced
	if sweep {
		r.needSweep = false
	}
	r.mu.Unlock()
	if sweep {
		r.startSweep(ctx)
	}
}

// reconcilePath brings one socket closer to its desired state. Operations
// are per socket path, so the order across paths does not matter; an
// operation that cannot start now (running, or in backoff) wakes the path
// again when it ends.
func (r *Reconciler) reconcilePath(ctx context.Context, path string) {
	p, registered := r.asw.Get(path)
	d, desired := r.dsw.Get(path)

	// 1. Unregister what is gone or has a new generation.
	if registered && (!desired || d.Generation != p.Generation) {
		gen := p.Generation
		if desired {
			gen = d.Generation
		}
		r.run(ctx, path, gen, r.unregisterOp(p))
	}

	// 2. Register again what a handler's restarted downstream lost.
	r.mu.Lock()
	again := r.reregister[path]
	r.mu.Unlock()
	if again {
		if !registered || !desired || p.Generation != d.Generation {
			// Gone or replaced: the other steps handle it.
			r.dropReregister(path)
		} else if r.run(ctx, path, p.Generation, r.reregisterOp(p)) {
			r.dropReregister(path)
		}
	}

	// 3. Register what is missing; keep a status entry per socket.
	if desired {
		r.ensureStatus(d)
		if !r.asw.ExistsWithGeneration(d.Path, d.Generation) {
			r.run(ctx, d.Path, d.Generation, r.registerOp(d))
		}
		return
	}

	// 4. Forget a socket that is gone and has nothing running.
	if _, ok := r.asw.Get(path); ok {
		return
	}
	if st, ok := r.exec.State(path); ok && st.Running {
		return
	}
	r.exec.Forget(path)
	r.removeStatus(path)
}

// desired reports whether the socket at path with generation is in the
// DSW.
func (r *Reconciler) desired(path, generation string) bool {
	d, ok := r.dsw.Get(path)
	return ok && d.Generation == generation
}

func (r *Reconciler) dropReregister(path string) {
	r.mu.Lock()
	delete(r.reregister, path)
	r.mu.Unlock()
}

// run starts op and reports whether it started. Backoff and a running
// operation are expected; they are not errors.
func (r *Reconciler) run(ctx context.Context, path, gen string, op executor.Op) bool {
	err := r.exec.Run(ctx, path, gen, op)
	if err != nil && !executor.IsBackoff(err) {
		r.log.Error("starting operation", "socket_path", path, "error", err)
	}
	return err == nil
}

func (r *Reconciler) startSweep(ctx context.Context) {
	for typ, h := range r.handlers {
		s, ok := h.(Sweeper)
		if !ok {
			continue
		}
		r.bg.Add(1)
		go func() {
			defer r.bg.Done()
			n, err := s.Sweep(ctx, r.desired)
			if err != nil && ctx.Err() == nil {
				// Try again at the next pass; warn once per failure streak.
				r.mu.Lock()
				r.needSweep = true
				warn := !r.sweepFailing
				r.sweepFailing = true
				r.mu.Unlock()
				lvl := slog.LevelDebug
				if warn {
					lvl = slog.LevelWarn
				}
				r.log.Log(ctx, lvl, "sweeping registrations whose sockets are gone failed; retrying at the next pass", "type", typ, "removed", n, "error", err)
				return
			}
			r.mu.Lock()
			r.sweepFailing = false
			r.mu.Unlock()
			if n > 0 {
				r.log.Info("swept registrations whose sockets are gone", "type", typ, "removed", n)
			}
		}()
	}
}

// Plugins returns every known socket's status, sorted by socket path.
func (r *Reconciler) Plugins() []PluginStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pluginsLocked()
}

func (r *Reconciler) pluginsLocked() []PluginStatus {
	out := make([]PluginStatus, 0, len(r.status))
	for _, s := range r.status {
		out = append(out, s.clone())
	}
	slices.SortFunc(out, func(a, b PluginStatus) int { return cmp.Compare(a.SocketPath, b.SocketPath) })
	return out
}

// Plugin returns one socket's status.
func (r *Reconciler) Plugin(path string) (PluginStatus, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.status[path]
	if !ok {
		return PluginStatus{}, false
	}
	return s.clone(), true
}

// Watch returns the current statuses and a subscription to every change
// after them, with the revision the snapshot describes.
func (r *Reconciler) Watch() ([]PluginStatus, uint64, *stream.Subscription[Change]) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pluginsLocked(), r.revision, r.hub.Subscribe()
}

func (r *Reconciler) ensureStatus(d cache.Socket) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.status[d.Path]
	if ok && s.Generation == d.Generation {
		return
	}
	if !ok {
		s = &PluginStatus{SocketPath: d.Path}
		r.status[d.Path] = s
	}
	registered := r.asw.ExistsWithGeneration(d.Path, d.Generation)
	*s = PluginStatus{SocketPath: d.Path, Generation: d.Generation, State: StatePending, LastTransition: r.clock.Now(),
		Name: s.Name, Type: s.Type, Endpoint: s.Endpoint, Versions: s.Versions, LastTraceID: s.LastTraceID}
	if registered {
		s.State = StateRegistered
	}
	r.publishLocked(false, s)
}

// update changes path's status (creating it) and publishes the change.
func (r *Reconciler) update(path, gen string, f func(s *PluginStatus)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.status[path]
	if !ok {
		s = &PluginStatus{SocketPath: path, Generation: gen, State: StatePending, LastTransition: r.clock.Now()}
		r.status[path] = s
	}
	if s.Generation != gen {
		// A newer generation took over the path; this operation's news is
		// stale.
		return
	}
	before := s.State
	f(s)
	if s.State != before {
		s.LastTransition = r.clock.Now()
	}
	r.publishLocked(false, s)
}

func (r *Reconciler) removeStatus(path string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.status[path]
	if !ok {
		return
	}
	delete(r.status, path)
	delete(r.deleteTrace, path)
	r.publishLocked(true, s)
}

func (r *Reconciler) publishLocked(removed bool, s *PluginStatus) {
	r.revision++
	r.hub.Publish(Change{Removed: removed, Plugin: s.clone(), Revision: r.revision})
}
