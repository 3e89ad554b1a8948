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
// The filesystem side (fsnotify, watches, scans) is in fsevents.go, the
// set's changes and their delivery in changes.go, metrics in metrics.go.
package socketwatch

import (
	"context"
	"errors"
	"fmt"
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
	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/stream"
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
	// hold together. Zero fields take the stream package's defaults (stream.DefaultSubscribers, …).
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
