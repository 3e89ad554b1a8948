// Package reconciler is the plugin manager's control loop: it drives the
// actual state of the world (registered plugins) towards the desired state
// (sockets the watcher reports), as the kubelet's reconciler does, but
// event-driven: a change of the desired state wakes a pass at once, a retry
// wakes one when its backoff ends, and a periodic resync is only a safety
// net.
//
// A pass first unregisters what is gone, then re-registers what a handler
// asked for (a restarted devicemanager), then registers what is missing,
// including a socket recreated with a new generation, whose registration
// replaces the old one in place (no deregister-then-register). Each operation runs in the executor: one per
// socket path at a time, with backoff per socket generation. What the loop
// learns is recorded on a status.Board, which the API publishes; the loop
// never reads its decisions back from it.
//
// The files: reconciler.go (the loop and its inputs), register.go (the
// kubelet's register sequence, step by step, and the refusals in the
// kubelet's words), pluginconn.go (the plugin's side of it: GetInfo and
// NotifyRegistrationStatus), dial.go (dialling a registration socket
// across the bind→listen gap, and failing fast on a stale one),
// operations.go (unregister and register again), orphans.go (downstream
// registrations whose sockets are gone), trace.go (spans), metrics.go.
//
// The loop knows no plugin type by name: what a type needs beyond
// cache.Handler it says through the optional interfaces of package cache
// (cache.EndpointWaiter, cache.EndpointKeyed, cache.OrphanDeregisterer).
package reconciler

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/checkpoint"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/clock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

// Defaults.
const (
	DefaultResyncPeriod   = 5 * time.Minute
	DefaultGetInfoTimeout = time.Second     // the kubelet's
	DefaultNotifyTimeout  = 5 * time.Second // the kubelet's
	// DefaultRefusedWindow is how long a socket that refuses connections
	// is redialled: the gap between a plugin's bind() (when fsnotify
	// reports the socket) and its listen() (DESIGN "Dialling a new socket",
	// "Stale sockets").
	DefaultRefusedWindow = 50 * time.Millisecond
	// DefaultEndpointWait is how long a device plugin's endpoint that does
	// not exist yet is waited for: the kubelet's dial timeout.
	DefaultEndpointWait = 10 * time.Second
)

// Options configure a Reconciler.
type Options struct {
	// Handlers by plugin type (DevicePlugin, CSIPlugin, DRAPlugin).
	Handlers map[string]cache.Handler
	// Status receives every socket's status; a new board when nil.
	Status *status.Board
	Log    *slog.Logger
	// Clock drives backoff and resync; the wall clock when nil.
	Clock clock.Clock
	// ResyncPeriod is the safety-net pass interval (DefaultResyncPeriod
	// when 0).
	ResyncPeriod time.Duration
	// GetInfoTimeout bounds dialling the plugin and its GetInfo, on Clock
	// (DefaultGetInfoTimeout when 0); NotifyTimeout bounds
	// NotifyRegistrationStatus (DefaultNotifyTimeout when 0).
	GetInfoTimeout time.Duration
	NotifyTimeout  time.Duration
	// RefusedWindow bounds the redials of a socket that refuses
	// connections, on the wall clock (DefaultRefusedWindow when 0): past
	// it the attempt fails and backs off, freeing its worker.
	RefusedWindow time.Duration
	// EndpointWait bounds the wait for a device plugin's endpoint that
	// does not exist yet, on the wall clock (DefaultEndpointWait when 0).
	EndpointWait time.Duration
	// MaxParallel bounds operations executing at once (see executor).
	MaxParallel int
	// Checkpoint, when set, is the registrations file: the registrations
	// it held are adopted at the first snapshot, and every registration
	// made and told to its plugin, or undone, is written to it.
	Checkpoint *checkpoint.File
	// Confiner, when set, refuses plugin endpoints outside the allowed
	// directories (reported to the plugin as a validation failure), and
	// every dial of a plugin's registration socket (GetInfo, Notify, and
	// each reconnect) connects only a socket it checked inside them.
	Confiner *unixsock.Confiner
}

// Reconciler owns the DSW, the ASW and the operations between them. Its
// methods are safe for concurrent use.
type Reconciler struct {
	dsw      cache.DesiredStateOfWorld
	asw      cache.ActualStateOfWorld
	handlers map[string]cache.Handler
	status   *status.Board
	log      *slog.Logger
	clock    clock.Clock
	exec     *executor.Executor
	opts     Options
	metrics  *metrics
	ckpt     *checkpoint.File

	wake chan struct{}
	bg   sync.WaitGroup

	mu         sync.Mutex
	reregister map[string]bool
	orphans    orphanCheck
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
	if o.Status == nil {
		o.Status = status.New(o.Clock, stream.Limits{})
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
	if o.RefusedWindow <= 0 {
		o.RefusedWindow = DefaultRefusedWindow
	}
	if o.EndpointWait <= 0 {
		o.EndpointWait = DefaultEndpointWait
	}
	r := &Reconciler{
		dsw:        cache.NewDesiredStateOfWorld(),
		asw:        cache.NewActualStateOfWorld(),
		handlers:   o.Handlers,
		status:     o.Status,
		log:        o.Log,
		clock:      o.Clock,
		opts:       o,
		wake:       make(chan struct{}, 1),
		reregister: map[string]bool{},
		dirty:      map[string]struct{}{},
		syncedCh:   make(chan struct{}),
		ckpt:       o.Checkpoint,
	}
	r.metrics = newMetrics(r)
	r.exec = executor.New(executor.Options{Clock: o.Clock, Log: o.Log, MaxParallel: o.MaxParallel, Due: r.wakePath})
	return r
}

// DSW returns the desired state of the world.
func (r *Reconciler) DSW() cache.DesiredStateOfWorld { return r.dsw }

// ASW returns the actual state of the world.
func (r *Reconciler) ASW() cache.ActualStateOfWorld { return r.asw }

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
// watcher restart causes no re-registration. The first snapshot adopts the
// registrations file's registrations whose sockets it holds with the same
// generation, so a reconciler restart causes none either. After the first
// snapshot, downstream registrations whose sockets are gone are
// deregistered.
func (r *Reconciler) ReplaceSockets(sockets []cache.Socket) {
	added, changed, removed := r.dsw.Replace(sockets)
	r.mu.Lock()
	if !r.synced {
		r.synced = true
		r.adoptRecoveredLocked()
		close(r.syncedCh)
		r.orphans.due = true
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
	r.status.SetDeleteTrace(path, traceContext)
	r.wakePath(path)
}

// Reregister asks for every registered plugin of the types given to be
// registered with its handler again (their downstream restarted and lost
// them), and for the downstream registrations whose sockets are gone to be
// deregistered. Registrations in backoff are retried at once: those that
// failed while the downstream was down need not wait out their backoff.
func (r *Reconciler) Reregister(types ...string) {
	r.mu.Lock()
	for _, p := range r.asw.List() {
		if slices.Contains(types, p.Type) {
			r.reregister[p.SocketPath] = true
		}
	}
	r.orphans.due = true
	r.mu.Unlock()
	if retried := r.exec.RetryNow(); len(retried) > 0 {
		r.log.Info("retrying failed registrations at once: the downstream restarted", "types", types, "sockets", len(retried))
	}
	r.Wake()
}

// Run reconciles until ctx ends, then waits for running operations.
func (r *Reconciler) Run(ctx context.Context) error {
	stopResync := r.resyncEvery(ctx, r.opts.ResyncPeriod)
	defer func() {
		stopResync()
		r.exec.Wait()
		r.bg.Wait()
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

// resyncEvery wakes a pass over every socket each period until ctx ends or
// the returned function is called.
func (r *Reconciler) resyncEvery(ctx context.Context, period time.Duration) (stop func()) {
	var mu sync.Mutex
	var timer clock.Timer
	var arm func()
	arm = func() {
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		timer = r.clock.AfterFunc(period, func() {
			r.log.Debug("periodic resync")
			r.Wake()
			arm()
		})
	}
	arm()
	return func() {
		mu.Lock()
		defer mu.Unlock()
		if timer != nil {
			timer.Stop()
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
		for _, path := range r.status.Paths() {
			dirty[path] = struct{}{}
		}
		r.mu.Lock()
		for path := range r.reregister {
			dirty[path] = struct{}{}
		}
		r.mu.Unlock()
	}
	// Every socket of the pass has its status before any of the pass's
	// operations starts: one that finishes at once (a healthy plugin in a
	// burst of stale sockets) cannot be seen registered while a socket
	// reported before it is not known at all.
	for path := range dirty {
		if d, ok := r.dsw.Get(path); ok {
			r.status.Track(d.Path, d.Generation, r.asw.ExistsWithGeneration(d.Path, d.Generation))
		}
	}
	for path := range dirty {
		r.reconcilePath(ctx, path)
	}
	if r.orphansDue() {
		r.deregisterOrphans(ctx)
	}
}

// reconcilePath brings one socket closer to its desired state. Operations
// are per socket path, so the order across paths does not matter; an
// operation that cannot start now (running, or in backoff) wakes the path
// again when it ends.
func (r *Reconciler) reconcilePath(ctx context.Context, path string) {
	p, registered := r.asw.Get(path)
	d, desired := r.dsw.Get(path)

	// 0. A registration under way (a first one, or one again after a
	// downstream restart) for a socket that is gone, or that was
	// recreated, is cancelled: its RPCs end, and a wait downstream (the
	// devicemanager waiting for a device plugin's endpoint file) with them.
	keep := ""
	if desired {
		keep = d.Generation
	}
	if !desired || d.Generation != "" {
		if r.exec.Cancel(path, keep, errSocketGone) {
			r.log.Info("registration cancelled: its socket was removed or recreated", "socket_path", path)
		}
	}

	// 1. Unregister what is gone. A socket with a new generation is not
	// unregistered: step 3 registers the new generation in place of the
	// old one (no dip downstream), and the register operation deregisters
	// the old one if it must.
	if registered && !desired {
		r.run(ctx, path, p.Generation, func(ctx context.Context, _ executor.Attempt) error { return r.unregister(ctx, p) })
	}

	// 2. Register again what a handler's restarted downstream lost.
	r.mu.Lock()
	again := r.reregister[path]
	r.mu.Unlock()
	// While its handler's peer is not reachable, it waits: the pass that
	// follows the peer becoming so (Wake) registers it.
	if again && (!registered || !desired || p.Generation != d.Generation) {
		// Gone or replaced: the other steps handle it.
		r.dropReregister(path)
	} else if again && downstreamReady(p) {
		// Dropped before the operation starts, which may ask for it
		// again (registerAgain); kept when it could not start.
		r.dropReregister(path)
		if !r.runCancellable(ctx, path, p.Generation, func(ctx context.Context, _ executor.Attempt) error { return r.registerAgain(ctx, p) }) {
			r.markReregister(path)
		}
	}

	// 3. Register what is missing (reconcile gave it its status entry).
	if desired {
		if !r.asw.ExistsWithGeneration(d.Path, d.Generation) {
			r.runCancellable(ctx, d.Path, d.Generation, func(ctx context.Context, a executor.Attempt) error { return r.register(ctx, d, a) })
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
	r.status.Remove(path)
}

// desired reports whether the socket at path with generation is in the
// DSW.
func (r *Reconciler) desired(path, generation string) bool {
	d, ok := r.dsw.Get(path)
	return ok && d.Generation == generation
}

func (r *Reconciler) markReregister(path string) {
	r.mu.Lock()
	r.reregister[path] = true
	r.mu.Unlock()
}

func (r *Reconciler) dropReregister(path string) {
	r.mu.Lock()
	delete(r.reregister, path)
	r.mu.Unlock()
}

// errSocketGone is the cause of a register operation cancelled because its
// socket was removed or recreated.
var errSocketGone = errors.New("registration cancelled: the socket was removed or recreated")

// runCancellable is run for a register operation, which a pass that finds
// its socket gone or recreated cancels (step 0 of reconcilePath).
func (r *Reconciler) runCancellable(ctx context.Context, path, gen string, op executor.Op) bool {
	err := r.exec.RunCancellable(ctx, path, gen, op)
	if err != nil && !executor.IsBackoff(err) {
		r.log.Error("starting operation", "socket_path", path, "error", err)
	}
	return err == nil
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
