package socketwatch

// The set of sockets and its changes: what caused one, and how a change is
// applied under the lock, counted, logged and sent to the subscribers.

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
)

// cause is what made the watcher look at a path: it is logged and counted
// with each change.
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
		// The metrics move before the event is published: a subscriber that
		// has seen the event reads metrics that count it.
		w.metrics.events.WithLabelValues(ch.typ.String()).Inc()
		w.metrics.sockets.Set(float64(len(w.sockets)))
		w.hub.Publish(ev)
		out = append(out, logged{ctx, ev})
	}
	w.mu.Unlock()

	for _, l := range out {
		msg := "socket appeared"
		if l.ev.Type == Deleted {
			msg = "socket disappeared"
		}
		w.log.InfoContext(l.ctx, msg, "path", bounds.PathText(l.ev.Path), "generation", l.ev.Generation, "revision", l.ev.Revision, "cause", c.String())
	}
}
