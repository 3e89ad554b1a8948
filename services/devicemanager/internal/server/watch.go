package server

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// Default bounds of the WatchResources streams of one service (DESIGN
// "Bounds"). A node needs a handful of watchers (the reconciler, a few
// nodeplugctl or monitoring clients); the byte bounds hold a large node's
// snapshot (hundreds of resources, thousands of devices) several times over.
// With every stream stalled, the service holds at most DefaultWatchBytes of
// messages, plus what gRPC itself buffers per stream (its 64 KiB write
// quota) and the manager's hub buffer per subscriber.
const (
	DefaultWatchStreams     = 64
	DefaultWatchBytes       = 32 << 20
	DefaultWatchStreamBytes = 4 << 20
)

// itemOverhead is added to the encoded size of each held message, for the
// Go structures behind it: a message in memory is larger than on the wire.
const itemOverhead = 512

// WatchLimits bound the WatchResources streams of one service. Zero fields
// take their defaults.
type WatchLimits struct {
	// Streams is how many streams may be open at once; the next one gets
	// RESOURCE_EXHAUSTED.
	Streams int
	// Bytes bounds the messages all streams hold, snapshots included,
	// before their clients take them. A new stream whose snapshot does not
	// fit gets RESOURCE_EXHAUSTED; a live change that does not fit ends the
	// stream holding the most, with RESOURCE_EXHAUSTED.
	Bytes int64
	// StreamBytes bounds the live changes one stream holds: a client that
	// falls that far behind is ended with RESOURCE_EXHAUSTED and
	// resubscribes.
	StreamBytes int64
}

func (l WatchLimits) withDefaults() WatchLimits {
	if l.Streams <= 0 {
		l.Streams = DefaultWatchStreams
	}
	if l.Bytes <= 0 {
		l.Bytes = DefaultWatchBytes
	}
	if l.StreamBytes <= 0 {
		l.StreamBytes = DefaultWatchStreamBytes
	}
	return l
}

// watchBudget accounts for the open WatchResources streams and the bytes
// of the messages they hold: queued for their client, or being sent. It is
// safe for concurrent use; one mutex guards it and every stream's queue.
//
// Each stream has a pump (receiving the manager's changes, never blocked
// by the client) and a sender (the handler, blocked while the client does
// not read). The pump queues what the sender has not sent yet; the queue
// is what the bounds apply to. A stream that falls behind is evicted: its
// queue is dropped at once, and it ends with RESOURCE_EXHAUSTED as soon as
// its sender returns. Memory is given back as queues drain.
type watchBudget struct {
	limits WatchLimits

	mu      sync.Mutex
	streams map[*watchStream]struct{}
	held    int64 // bytes held by every stream
	evicted int   // streams evicted since the start
}

func newWatchBudget(l WatchLimits) *watchBudget {
	return &watchBudget{limits: l.withDefaults(), streams: map[*watchStream]struct{}{}}
}

// watchStream is one stream's queue, guarded by watchBudget.mu.
type watchStream struct {
	b     *watchBudget
	ready chan struct{} // a message was queued, or the stream ended

	queue    []heldMsg
	head     int
	queued   int64 // bytes of queue[head:]
	live     int64 // of which live changes (not the snapshot)
	inFlight int64 // bytes of the message being sent
	evicted  error // why the stream was evicted
	ended    bool  // its subscription ended: after the queue, the stream ends
	endErr   error // why (nil for a clean end)
}

type heldMsg struct {
	msg      *dmv1.WatchResourcesResponse
	cost     int64
	snapshot bool
}

func cost(m *dmv1.WatchResourcesResponse) int64 { return int64(proto.Size(m)) + itemOverhead }

// open admits a new stream, or fails with errdefs.ErrResourceExhausted
// when the streams are at their limit. The stream then takes its snapshot
// with admit.
func (b *watchBudget) open() (*watchStream, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.streams) >= b.limits.Streams {
		return nil, fmt.Errorf("too many WatchResources streams: %d open, the limit is %d; retry later: %w",
			len(b.streams), b.limits.Streams, errdefs.ErrResourceExhausted)
	}
	w := &watchStream{b: b, ready: make(chan struct{}, 1)}
	b.streams[w] = struct{}{}
	return w, nil
}

// admit queues the snapshot messages (snapshot items and the synced
// marker), or fails with errdefs.ErrResourceExhausted when they do not fit
// in the bytes left. Call it once, before any push.
func (w *watchStream) admit(snapshot []*dmv1.WatchResourcesResponse) error {
	queue := make([]heldMsg, 0, len(snapshot))
	var total int64
	for _, m := range snapshot {
		c := cost(m)
		queue = append(queue, heldMsg{msg: m, cost: c, snapshot: true})
		total += c
	}
	b := w.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held+total > b.limits.Bytes {
		return fmt.Errorf("WatchResources streams hold %d bytes; a snapshot of %d more would pass the limit of %d; retry later: %w",
			b.held, total, b.limits.Bytes, errdefs.ErrResourceExhausted)
	}
	w.queue = queue
	w.queued = total
	b.held += total
	w.notify()
	return nil
}

// close removes w and gives back everything it holds. Call it once, when
// the handler returns.
func (w *watchStream) close() {
	b := w.b
	b.mu.Lock()
	defer b.mu.Unlock()
	w.dropLocked()
	b.held -= w.inFlight
	w.inFlight = 0
	delete(b.streams, w)
}

func (w *watchStream) notify() {
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// dropLocked empties w's queue and gives its bytes back.
func (w *watchStream) dropLocked() {
	w.b.held -= w.queued
	w.queue, w.head, w.queued, w.live = nil, 0, 0, 0
}

// evictLocked ends w with err: its queue is dropped now; its sender
// returns err when it next asks for a message.
func (w *watchStream) evictLocked(err error) {
	if w.evicted != nil {
		return
	}
	w.evicted = err
	w.dropLocked()
	w.b.evicted++
	w.notify()
}

// push queues a live change for w. A stream past its own bound is evicted;
// when all streams together would pass theirs, the stream holding the most
// queued bytes is (which may be w). It reports whether w is still going.
func (w *watchStream) push(m *dmv1.WatchResourcesResponse) bool {
	c := cost(m)
	b := w.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.evicted != nil || w.ended {
		return false
	}
	if w.live+c > b.limits.StreamBytes {
		w.evictLocked(fmt.Errorf("WatchResources subscriber fell behind: %d bytes of changes wait for it, the limit is %d; resubscribe: %w",
			w.live, b.limits.StreamBytes, errdefs.ErrResourceExhausted))
		return false
	}
	for b.held+c > b.limits.Bytes && w.evicted == nil {
		victim := w
		for o := range b.streams {
			if o.queued > victim.queued {
				victim = o
			}
		}
		victim.evictLocked(fmt.Errorf("WatchResources streams hold %d bytes, the limit is %d, and this subscriber held the most (%d); resubscribe: %w",
			b.held, b.limits.Bytes, victim.queued, errdefs.ErrResourceExhausted))
	}
	if w.evicted != nil {
		return false
	}
	w.queue = append(w.queue, heldMsg{msg: m, cost: c})
	w.queued += c
	w.live += c
	b.held += c
	w.notify()
	return true
}

// end records that w's subscription ended, with err (nil for a clean
// end): the stream ends once its queue is sent.
func (w *watchStream) end(err error) {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	if !w.ended {
		w.ended, w.endErr = true, err
	}
	w.notify()
}

// next returns the next message to send, waiting for one until ctx ends.
// Its bytes stay held until sent is called. A nil message means the stream
// is over, with the error returned (nil for a clean end).
func (w *watchStream) next(ctx context.Context) (*dmv1.WatchResourcesResponse, error) {
	for {
		b := w.b
		b.mu.Lock()
		if w.evicted != nil {
			b.mu.Unlock()
			return nil, w.evicted
		}
		if w.head < len(w.queue) {
			h := w.queue[w.head]
			w.queue[w.head] = heldMsg{}
			w.head++
			w.queued -= h.cost
			if !h.snapshot {
				w.live -= h.cost
			}
			w.inFlight = h.cost
			if w.head == len(w.queue) {
				// Drained: give the queue's memory back.
				w.queue, w.head = nil, 0
			}
			b.mu.Unlock()
			return h.msg, nil
		}
		if w.ended {
			b.mu.Unlock()
			return nil, w.endErr
		}
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.ready:
		}
	}
}

// sent gives back the bytes of the message next returned last.
func (w *watchStream) sent() {
	w.b.mu.Lock()
	defer w.b.mu.Unlock()
	w.b.held -= w.inFlight
	w.inFlight = 0
}

// watchStats is a view of the budget, for tests.
type watchStats struct {
	streams int
	held    int64
	evicted int
}

func (b *watchBudget) stats() watchStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return watchStats{streams: len(b.streams), held: b.held, evicted: b.evicted}
}
