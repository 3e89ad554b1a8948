// Package socketwatch keeps the set of plugin registration sockets under one
// directory tree current with fsnotify and fans every change out to
// subscribers as a snapshot → synced → live stream. It knows nothing of gRPC:
// its errors wrap pkg/errdefs sentinels, and the watcher service's gRPC
// adapter (internal/server) is a thin layer over Watcher.
//
// What counts, and how changes are reported (the watcher-events contract):
//
//   - The tree is watched recursively. A new directory gets its fsnotify watch
//     before it is read, so nothing created inside it meanwhile is missed.
//   - Any path with a component (below the watched directory) that starts with
//     "." is ignored, at walk and at event time alike; hidden directories are
//     neither watched nor walked.
//   - Only Unix sockets count. A symlink counts only when it resolves to a
//     socket inside the allowed directories (Options.Confiner); its
//     generation is its target's, as of when the link was seen (a target
//     recreated behind an unchanged link is noticed only by a rescan).
//     Symlinked directories are not followed.
//   - Create events are checked against the filesystem; Remove and Rename (a
//     move away) delete the path and every socket below it. Write and Chmod
//     are ignored.
//   - The generation of a socket is unixsock.Stat(path).Generation(): it is
//     new when the socket is recreated and survives chmod, chown and a watcher
//     restart.
//   - For one path, live events strictly alternate CREATED and DELETED. When a
//     path that is already known turns up with a new generation (a Create for
//     a recreated socket whose Remove was not seen, or a rescan), the watcher
//     emits DELETED with the old generation, then CREATED with the new one. A
//     Create for a known path with an unchanged generation emits nothing.
//   - On fsnotify queue overflow the whole tree is rescanned and only the
//     differences are emitted.
//   - Every change increments the per-process revision. Every live event
//     carries the W3C context of a new root span started for it.
//
// socketwatch.go is over 500 lines because the walk, the event handling and
// the overflow rescan share one set of state and one lock: the rules above
// are applied in one place, so the walk and the events cannot disagree.
// Metrics are in metrics.go.
package socketwatch

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// ErrStopped ends every subscription when the watcher stops. It wraps
// errdefs.ErrUnavailable: the client should resubscribe (to the next
// instance).
var ErrStopped = fmt.Errorf("socket watcher stopped: %w", errdefs.ErrUnavailable)

// TracerName is the instrumentation name of the watcher's spans.
const TracerName = "github.com/nodeplug/nodeplug/services/watcher"

// fsnotifyBuffer is the number of events fsnotify may hold between its reader
// and ours, on top of the kernel's queue.
const fsnotifyBuffer = 1024

// EventType says what happened to a socket path.
type EventType int

// Event types.
const (
	Created EventType = iota + 1
	Deleted
)

func (t EventType) String() string {
	switch t {
	case Created:
		return "created"
	case Deleted:
		return "deleted"
	default:
		return "unspecified"
	}
}

// Socket is one socket in the current set.
type Socket struct {
	Path       string
	Generation string
	// ObservedTime is when this watcher first saw this generation.
	ObservedTime time.Time
}

// Event is one item of a subscription: a snapshot entry (Snapshot true, always
// Created, no trace context) or a live change.
type Event struct {
	Type       EventType
	Path       string
	Generation string // for Deleted: the generation that went away
	Revision   uint64
	// ObservedTime is when the change was observed (for snapshot entries:
	// when the socket was first seen).
	ObservedTime time.Time
	Snapshot     bool
	// TraceContext is the W3C context (traceparent, tracestate) of the root
	// span started for a live event; nil for snapshot entries.
	TraceContext map[string]string
}

// eventOverhead is what an Event holds in a subscriber's queue besides its
// strings: the struct, its queue entry, and the trace context map's own
// structure.
const eventOverhead = 256

// size is the bytes ev holds in a subscriber's queue.
func (ev Event) size() int {
	n := eventOverhead + len(ev.Path) + len(ev.Generation)
	for k, v := range ev.TraceContext {
		n += len(k) + len(v)
	}
	return n
}

// Synced marks the end of a snapshot.
type Synced struct {
	Revision    uint64
	SocketCount int
}

// Options configure a Watcher.
type Options struct {
	// Dir is the absolute directory to watch (<root>/plugins_registry). It is
	// created with mode 0750 if missing.
	Dir string
	// Confiner decides which symlink targets count. Nil: no symlink counts.
	Confiner *unixsock.Confiner
	// Log receives state changes (sockets appearing and disappearing,
	// rescans). Nil discards.
	Log *slog.Logger
	// Registerer receives the watcher's metrics. Nil: not registered.
	Registerer prometheus.Registerer
	// TracerProvider starts the per-event root spans. Nil: the global one.
	TracerProvider trace.TracerProvider
	// Limits bound the subscriptions (WatchSocketEvents streams): how many
	// may be open, how far one may fall behind, and the bytes all of them
	// hold together. Zero fields take stream.DefaultLimits.
	Limits stream.Limits

	// Test seams. dropEvent, when it returns true, makes the watcher act as
	// if fsnotify had lost the event; injectErrors feeds errors as if they
	// came from fsnotify's Errors channel (fsnotify.ErrEventOverflow among
	// them).
	dropEvent    func(fsnotify.Event) bool
	injectErrors <-chan error
}

// Watcher watches one directory tree. Its methods are safe for concurrent
// use. Run must be called once to process changes; it releases the fsnotify
// watch and ends every subscription when it returns.
type Watcher struct {
	dir        string
	conf       *unixsock.Confiner
	log        *slog.Logger
	tracer     trace.Tracer
	instanceID string
	fsw        *fsnotify.Watcher
	metrics    *metrics

	dropEvent    func(fsnotify.Event) bool
	injectErrors <-chan error

	closeOnce sync.Once

	// mu guards the socket set and the revision, and orders Subscribe
	// against Publish so a snapshot and its live events never overlap or
	// leave a gap.
	mu      sync.Mutex
	sockets map[string]Socket
	// under counts the known sockets below each directory (the watched
	// one included), so that an event for one path looks at that path
	// alone unless it is a directory with known sockets below it: a burst
	// of N events costs O(N), not O(N²).
	under    map[string]int
	revision uint64
	hub      *stream.Hub[Event]
	stopped  bool
}

// New creates the directory if needed, starts watching it and reads the
// sockets already present. Changes are processed once Run is called.
func New(opts Options) (*Watcher, error) {
	if !filepath.IsAbs(opts.Dir) {
		return nil, fmt.Errorf("watch directory %q is not absolute: %w", opts.Dir, errdefs.ErrInvalidArgument)
	}
	dir := filepath.Clean(opts.Dir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create plugin directory %s: %w", dir, err)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, fmt.Errorf("plugin directory %s: %w", dir, err)
	} else if !fi.IsDir() {
		return nil, fmt.Errorf("plugin directory %s is not a directory: %w", dir, errdefs.ErrInvalidArgument)
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	fsw, err := fsnotify.NewBufferedWatcher(fsnotifyBuffer)
	if err != nil {
		return nil, fmt.Errorf("start fsnotify: %w", err)
	}
	w := &Watcher{
		dir:          dir,
		conf:         opts.Confiner,
		log:          log.With("component", "socketwatch"),
		tracer:       tp.Tracer(TracerName),
		instanceID:   uuid.NewString(),
		fsw:          fsw,
		dropEvent:    opts.dropEvent,
		injectErrors: opts.injectErrors,
		sockets:      map[string]Socket{},
		under:        map[string]int{},
		hub:          stream.NewBoundedHub(opts.Limits, Event.size),
	}
	w.metrics = newMetrics(opts.Registerer, w.hub.Stats)
	if err := w.fsw.Add(dir); err != nil {
		_ = w.fsw.Close()
		return nil, fmt.Errorf("watch plugin directory %s: %w", dir, err)
	}
	w.watchParent()
	w.sync(dir, causeInitial)
	w.log.Info("watching plugin directory", "dir", dir, "sockets", len(w.sockets), "instance_id", w.instanceID)
	return w, nil
}

// Dir returns the watched directory.
func (w *Watcher) Dir() string { return w.dir }

// InstanceID identifies this watcher; it is new for every Watcher.
func (w *Watcher) InstanceID() string { return w.instanceID }

// List returns the current sockets, sorted by path, and the revision they
// describe.
func (w *Watcher) List() ([]Socket, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Socket, 0, len(w.sockets))
	for _, s := range w.sockets {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Socket) int { return strings.Compare(a.Path, b.Path) })
	return out, w.revision
}

// Subscribe returns a snapshot of the current sockets (Created events with
// Snapshot set, sorted by path), the synced marker that follows it, and a
// subscription that delivers the snapshot, then every later change. The
// caller must Close the subscription. It fails with ErrStopped once Run has
// returned, and with an error wrapping stream.ErrTooManySubscribers (and
// errdefs.ErrResourceExhausted) when Options.Limits leave no room.
func (w *Watcher) Subscribe() ([]Event, Synced, *stream.Subscription[Event], error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return nil, Synced{}, nil, ErrStopped
	}
	snap := make([]Event, 0, len(w.sockets))
	for _, s := range w.sockets {
		snap = append(snap, Event{
			Type:         Created,
			Path:         s.Path,
			Generation:   s.Generation,
			Revision:     w.revision,
			ObservedTime: s.ObservedTime,
			Snapshot:     true,
		})
	}
	slices.SortFunc(snap, func(a, b Event) int { return strings.Compare(a.Path, b.Path) })
	sub, err := w.hub.Join(snap)
	if err != nil {
		w.metrics.refused.Inc()
		return nil, Synced{}, nil, fmt.Errorf("subscribe to the sockets under %s: %w", w.dir, err)
	}
	return snap, Synced{Revision: w.revision, SocketCount: len(snap)}, sub, nil
}

// Watch streams the snapshot, the synced marker and live events through send
// and synced until ctx ends (ctx's error), a send fails (its error), the
// watcher stops (ErrStopped, which wraps errdefs.ErrUnavailable), or a
// bound of Options.Limits is passed: no room for the subscriber
// (stream.ErrTooManySubscribers), the subscriber fell behind
// (stream.ErrSlow) or held the most when all of them together held their
// byte budget (stream.ErrOverBudget); those wrap
// errdefs.ErrResourceExhausted. The errors are plain errors; the gRPC
// server's interceptor maps them to status codes.
func (w *Watcher) Watch(ctx context.Context, send func(Event) error, synced func(Synced) error) error {
	_, marker, sub, err := w.Subscribe()
	if err != nil {
		return err
	}
	err = stream.Serve(ctx, sub, send, func() error { return synced(marker) })
	if errors.Is(err, stream.ErrSlow) || errors.Is(err, stream.ErrOverBudget) {
		w.log.Warn("closed a subscriber that fell behind; it resubscribes", "error", err)
	}
	return err
}

// Run processes filesystem changes until ctx ends. It then stops watching and
// ends every subscription with ErrStopped. It returns nil when ctx ended and
// an error when fsnotify stopped by itself.
func (w *Watcher) Run(ctx context.Context) error {
	defer w.Close()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.fsw.Events:
			if !ok {
				return fmt.Errorf("fsnotify event channel for %s closed", w.dir)
			}
			w.handleEvent(ev)
		case err, ok := <-w.fsw.Errors:
			if !ok {
				return fmt.Errorf("fsnotify error channel for %s closed", w.dir)
			}
			w.handleError(err)
		case err := <-w.injectErrors:
			w.handleError(err)
		}
	}
}

// Close stops watching and ends every subscription with ErrStopped. Run
// calls it on return; it is safe to call more than once.
func (w *Watcher) Close() {
	w.closeOnce.Do(func() {
		_ = w.fsw.Close()
		w.mu.Lock()
		w.stopped = true
		w.hub.Close(ErrStopped)
		w.mu.Unlock()
	})
}

func (w *Watcher) handleEvent(ev fsnotify.Event) {
	if w.dropEvent != nil && w.dropEvent(ev) {
		return
	}
	name := filepath.Clean(ev.Name)
	removed := ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)
	if name == w.dir {
		switch {
		case removed:
			w.rootGone()
		case ev.Has(fsnotify.Create):
			// Someone else recreated the directory first.
			w.metrics.rescans.Inc()
			w.sync(w.dir, causeRescan)
		}
		return
	}
	if w.hidden(name) {
		return
	}
	switch {
	case ev.Has(fsnotify.Create):
		w.sync(name, causeEvent)
	case removed:
		if ev.Has(fsnotify.Rename) {
			w.unwatch(name)
		}
		w.forget(name, causeEvent)
	}
}

func (w *Watcher) handleError(err error) {
	if errors.Is(err, fsnotify.ErrEventOverflow) {
		w.metrics.rescans.Inc()
		w.log.Warn("fsnotify queue overflowed; rescanning the plugin directory", "dir", w.dir)
		w.sync(w.dir, causeRescan)
		return
	}
	w.log.Error("fsnotify error", "dir", w.dir, "error", err)
}

// watchParent watches the directory above the watched one, for the removal
// or move of the watched directory itself: the kernel reports the deletion of
// a directory on its own watch only once nothing pins it, and a plugin's open
// listener pins every directory above its socket. Events for the parent's
// other entries are ignored. A failure only loses that early notice.
func (w *Watcher) watchParent() {
	parent := filepath.Dir(w.dir)
	if parent == w.dir {
		return
	}
	if err := w.fsw.Add(parent); err != nil {
		w.log.Warn("cannot watch the parent of the plugin directory; its removal will go unnoticed", "dir", parent, "error", err)
	}
}

// rootGone handles the removal or move of the watched directory itself: every
// socket is gone; the directory is created again and watched anew.
func (w *Watcher) rootGone() {
	w.log.Warn("plugin directory was removed or moved; recreating it", "dir", w.dir)
	w.unwatch(w.dir)
	w.forget(w.dir, causeEvent)
	if err := os.MkdirAll(w.dir, 0o750); err != nil {
		w.log.Error("recreate plugin directory", "dir", w.dir, "error", err)
		return
	}
	w.watchParent()
	w.metrics.rescans.Inc()
	w.sync(w.dir, causeRescan)
}

// unwatch drops the fsnotify watches of dir and of every directory below it
// (after a move, the kernel keeps them on the moved inodes, under stale
// names).
func (w *Watcher) unwatch(dir string) {
	for _, p := range w.fsw.WatchList() {
		if within(p, dir) {
			_ = w.fsw.Remove(p)
		}
	}
}

// hidden reports whether p is outside the watched tree or has a component
// below it that starts with ".".
func (w *Watcher) hidden(p string) bool { return hiddenBelow(w.dir, p) }

// hiddenBelow reports whether p is outside the directory dir (absolute and
// clean) or has a component below it that starts with "." (the watcher
// contract's rule for what does not count; "." and ".." included). dir
// itself is not hidden.
func hiddenBelow(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return true
	}
	if rel == "." {
		return false
	}
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		if strings.HasPrefix(c, ".") {
			return true
		}
	}
	return false
}

// within reports whether p is dir or lies below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// scan returns the sockets at or below p (path → generation), adding an
// fsnotify watch to every directory before reading it.
func (w *Watcher) scan(p string) map[string]string {
	found := map[string]string{}
	w.visit(p, found)
	return found
}

func (w *Watcher) visit(p string, found map[string]string) {
	if w.hidden(p) {
		return
	}
	stat := os.Lstat
	if p == w.dir {
		stat = os.Stat // the root may itself be a symlink to a directory
	}
	fi, err := stat(p)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			w.log.Warn("cannot stat path in plugin directory", "path", p, "error", err)
		}
		return
	}
	if fi.IsDir() {
		// Watch first, read second: whatever is created after the watch is
		// added raises an event, whatever before is in the listing.
		if err := w.fsw.Add(p); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				w.log.Error("cannot watch directory", "dir", p, "error", err)
			}
			return
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				w.log.Warn("cannot read directory", "dir", p, "error", err)
			}
			return
		}
		for _, e := range entries {
			w.visit(filepath.Join(p, e.Name()), found)
		}
		return
	}
	if gen, ok := w.socketGeneration(p, fi.Mode()); ok {
		found[p] = gen
	}
}

// socketGeneration returns the generation of p when it counts as a socket.
func (w *Watcher) socketGeneration(p string, mode fs.FileMode) (string, bool) {
	target := p
	switch {
	case mode&fs.ModeSocket != 0:
	case mode&fs.ModeSymlink != 0:
		if w.conf == nil {
			return "", false
		}
		resolved, err := w.conf.Resolve(p)
		if err != nil {
			w.log.Debug("ignoring symlink", "path", p, "reason", err)
			return "", false
		}
		target = resolved
	default:
		return "", false
	}
	id, m, err := unixsock.Stat(target)
	if err != nil || m&fs.ModeSocket == 0 {
		return "", false
	}
	return id.Generation(), true
}

type cause int

const (
	causeInitial cause = iota // the walk in New: nobody is subscribed yet
	causeEvent                // an fsnotify event
	causeRescan               // a full rescan after queue overflow
)

func (c cause) String() string {
	switch c {
	case causeInitial:
		return "initial"
	case causeEvent:
		return "fsnotify"
	default:
		return "rescan"
	}
}

type change struct {
	typ  EventType
	path string
	gen  string
}

// sync brings the known sockets at and below p in line with the filesystem.
func (w *Watcher) sync(p string, c cause) {
	found := w.scan(p)
	w.mu.Lock()
	var changes []change
	w.knownLocked(p, func(path string, s Socket) {
		if gen, ok := found[path]; !ok || gen != s.Generation {
			changes = append(changes, change{Deleted, path, s.Generation})
		}
	})
	for path, gen := range found {
		if s, ok := w.sockets[path]; !ok || s.Generation != gen {
			changes = append(changes, change{Created, path, gen})
		}
	}
	// Deletions first, then creations, each by path: a changed generation
	// becomes DELETED(old) followed by CREATED(new).
	slices.SortFunc(changes, func(a, b change) int {
		if a.typ != b.typ {
			return int(b.typ) - int(a.typ)
		}
		return strings.Compare(a.path, b.path)
	})
	w.applyLocked(changes, c)
}

// forget removes the known sockets at and below p.
func (w *Watcher) forget(p string, c cause) {
	w.mu.Lock()
	var changes []change
	w.knownLocked(p, func(path string, s Socket) { changes = append(changes, change{Deleted, path, s.Generation}) })
	slices.SortFunc(changes, func(a, b change) int { return strings.Compare(a.path, b.path) })
	w.applyLocked(changes, c)
}

// knownLocked calls f with each known socket at or below p. Only a
// directory with known sockets below it is searched; any other path is
// looked up alone.
func (w *Watcher) knownLocked(p string, f func(path string, s Socket)) {
	if w.under[p] == 0 {
		if s, ok := w.sockets[p]; ok {
			f(p, s)
		}
		return
	}
	prefix := p + string(filepath.Separator)
	for path, s := range w.sockets {
		if path == p || strings.HasPrefix(path, prefix) {
			f(path, s)
		}
	}
}

// countLocked adds d to the count of known sockets of every directory
// between path's parent and the watched directory.
func (w *Watcher) countLocked(path string, d int) {
	for dir := filepath.Dir(path); within(dir, w.dir); dir = filepath.Dir(dir) {
		if w.under[dir] += d; w.under[dir] <= 0 {
			delete(w.under, dir)
		}
		if dir == w.dir {
			return
		}
	}
}

type logged struct {
	ctx context.Context
	ev  Event
}

// applyLocked records changes, publishes them and unlocks w.mu.
func (w *Watcher) applyLocked(changes []change, c cause) {
	if len(changes) == 0 {
		w.mu.Unlock()
		return
	}
	now := time.Now()
	out := make([]logged, 0, len(changes))
	for _, ch := range changes {
		w.revision++
		ev := Event{Type: ch.typ, Path: ch.path, Generation: ch.gen, Revision: w.revision, ObservedTime: now}
		switch ch.typ {
		case Created:
			if _, known := w.sockets[ch.path]; !known {
				w.countLocked(ch.path, 1)
			}
			w.sockets[ch.path] = Socket{Path: ch.path, Generation: ch.gen, ObservedTime: now}
		case Deleted:
			if _, known := w.sockets[ch.path]; known {
				w.countLocked(ch.path, -1)
			}
			delete(w.sockets, ch.path)
		}
		ctx := context.Background()
		if c != causeInitial {
			var span trace.Span
			ctx, span = w.tracer.Start(ctx, "watcher.socket_"+ch.typ.String(),
				trace.WithNewRoot(),
				trace.WithSpanKind(trace.SpanKindProducer),
				trace.WithTimestamp(now),
				trace.WithAttributes(
					attribute.String("socket.path", bounds.PathText(ch.path)), // a span attribute must be UTF-8 to export
					attribute.String("socket.generation", ch.gen),
					attribute.Int64("revision", int64(ev.Revision)),
					attribute.String("watcher.cause", c.String()),
					attribute.String("watcher.instance_id", w.instanceID),
				))
			ev.TraceContext = telemetry.Inject(ctx)
			span.End()
		}
		w.hub.Publish(ev)
		w.metrics.events.WithLabelValues(ch.typ.String()).Inc()
		out = append(out, logged{ctx, ev})
	}
	w.metrics.sockets.Set(float64(len(w.sockets)))
	w.mu.Unlock()

	for _, l := range out {
		msg := "socket appeared"
		if l.ev.Type == Deleted {
			msg = "socket disappeared"
		}
		w.log.InfoContext(l.ctx, msg, "path", bounds.PathText(l.ev.Path), "generation", l.ev.Generation, "revision", l.ev.Revision, "cause", c.String())
	}
}
