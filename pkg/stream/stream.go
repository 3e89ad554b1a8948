// Package stream implements the shape every Watch RPC in nodeplug has: a
// snapshot, one synced marker, then live items, each subscriber with its own
// queue, so one stalled client never slows the publisher or the other
// subscribers.
//
// A hub made with NewBoundedHub keeps the bounds of DESIGN "Bounds" for the
// Watch RPC it serves (one hub per service and RPC, so its bounds are the
// service's): how many subscriptions may be open, how many live items and
// bytes one subscriber may have waiting, and how many bytes all of them hold
// together, snapshots included. Past any of them a subscriber is refused or
// closed with an error that wraps errdefs.ErrResourceExhausted, which the
// server's interceptor maps to RESOURCE_EXHAUSTED; the client resubscribes.
// A closed subscriber's queue is dropped at once and a drained queue is
// freed, so the memory a burst took is given back.
//
// A hub does not know who subscribes. Slots keep the bounds by caller: how
// many streams one caller may hold, and how many of the total are kept for
// the services themselves; the API servers take a slot for every Watch
// stream before it joins its hub (access.WatchBounds).
package stream

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// The reasons a subscription is refused or closed. Each wraps
// errdefs.ErrResourceExhausted; the errors returned wrap one of them and
// say how far over which bound the subscriber went.
var (
	// ErrSlow: the subscriber fell behind its own bound (Limits.Items or
	// Limits.SubscriberBytes).
	ErrSlow = fmt.Errorf("subscriber fell behind the stream buffer; resubscribe: %w", errdefs.ErrResourceExhausted)
	// ErrOverBudget: all subscribers together held Limits.Bytes, and this
	// one held the most.
	ErrOverBudget = fmt.Errorf("the stream's subscribers hold their whole byte budget and this one held the most; resubscribe: %w", errdefs.ErrResourceExhausted)
	// ErrTooManySubscribers: Limits.Subscribers are open, or the new
	// subscriber's snapshot does not fit in the bytes left.
	ErrTooManySubscribers = fmt.Errorf("the stream has no room for another subscriber; retry later: %w", errdefs.ErrResourceExhausted)
)

// Default bounds of one hub. A node needs a handful of watchers (the
// reconciler, a few nodeplugctl or monitoring clients), so 64 streams leave
// room for tools without letting a runaway client open thousands. 4 MiB
// of live items per subscriber is thousands of changes behind, far more
// than a client that reads at all ever lags; 32 MiB for every subscriber
// together holds a large node's snapshot (thousands of sockets, devices or
// plugins) several times over. With every stream stalled a service holds
// at most DefaultBytes of items, plus what gRPC buffers per stream (its
// flow-control window, 64 KiB).
const (
	DefaultSubscribers     = 64
	DefaultBuffer          = 4096
	DefaultSubscriberBytes = 4 << 20
	DefaultBytes           = 32 << 20
)

// Limits bound the subscribers of one hub. Zero fields take the defaults.
type Limits struct {
	// Subscribers is how many subscriptions may be open at once; the next
	// Join fails with ErrTooManySubscribers.
	Subscribers int
	// Items is how many live items one subscriber may have waiting; past
	// it, the subscriber is closed with ErrSlow.
	Items int
	// SubscriberBytes bounds the bytes of one subscriber's waiting live
	// items; past it, the subscriber is closed with ErrSlow.
	SubscriberBytes int64
	// Bytes bounds what all subscribers hold together: snapshot items not
	// yet sent, live items waiting, and the item being sent. A snapshot that
	// does not fit is refused (ErrTooManySubscribers); a live item that does
	// not fit closes the subscriber holding the most (ErrOverBudget) until
	// it fits.
	Bytes int64
}

func (l Limits) withDefaults() Limits {
	if l.Subscribers <= 0 {
		l.Subscribers = DefaultSubscribers
	}
	if l.Items <= 0 {
		l.Items = DefaultBuffer
	}
	if l.SubscriberBytes <= 0 {
		l.SubscriberBytes = DefaultSubscriberBytes
	}
	if l.Bytes <= 0 {
		l.Bytes = DefaultBytes
	}
	return l
}

// Stats is a view of a hub's subscribers.
type Stats struct {
	Subscribers int
	// Held is the bytes the subscribers hold.
	Held int64
	// Closed counts the subscribers closed for falling behind or for the
	// byte budget, since the hub was made.
	Closed uint64
}

// Hub fans items out to subscribers. It is safe for concurrent use.
//
// To keep the snapshot and the live items consistent, the owner of the state
// must call Join (or Subscribe) and Publish while holding the lock that
// guards its state: then no change falls between a snapshot and the live
// items that follow it.
type Hub[T any] struct {
	limits Limits
	size   func(T) int

	mu       sync.Mutex
	subs     map[*Subscription[T]]struct{}
	held     int64
	closed   uint64
	isClosed bool  // Close was called
	closeErr error // with this
}

// NewBoundedHub returns a hub that keeps limits (zero fields take the
// defaults). size returns the bytes one item holds in memory; it must
// return the same for the same item each time. An item held by several
// subscribers counts once for each, which overstates memory shared
// between them: the bound errs on the safe side.
func NewBoundedHub[T any](limits Limits, size func(T) int) *Hub[T] {
	return &Hub[T]{limits: limits.withDefaults(), size: size, subs: map[*Subscription[T]]struct{}{}}
}

// Limits returns the hub's bounds.
func (h *Hub[T]) Limits() Limits { return h.limits }

// Subscription receives the items of one subscriber until it ends: its
// snapshot, then live items. Next (or Serve) takes them. After the
// subscription ended, Err says why (nil when it was closed by the
// subscriber or the hub closed cleanly).
type Subscription[T any] struct {
	hub  *Hub[T]
	keep func(T) bool // nil: every item
	once sync.Once
	done chan struct{}

	snapshotLen int

	// Guarded by hub.mu.
	queue    []entry[T]
	head     int
	items    int   // live items waiting
	live     int64 // bytes of the live items waiting
	queued   int64 // bytes of queue[head:]
	inFlight int64 // bytes of the item Next returned last
	ended    bool  // no more items will be queued
	dropped  bool  // closed for a bound: the queue is gone
	err      error
	ready    chan struct{} // signalled when an item is queued or it ends
}

type entry[T any] struct {
	item T
	size int64
	live bool
}

// Join registers a subscriber whose stream starts with snapshot and goes on
// with every item published from now on. It fails with an error wrapping ErrTooManySubscribers when Limits.Subscribers are open or
// the snapshot does not fit in the bytes left. The caller must Close the
// subscription.
func (h *Hub[T]) Join(snapshot []T) (*Subscription[T], error) {
	return h.JoinWhere(snapshot, nil)
}

// JoinWhere is Join for a subscriber that takes only the published items
// for which keep returns true (keep nil: every item); the snapshot is sent
// whole. Publish and Wanted call keep with the hub's lock held: it must be
// quick and must not call the hub.
func (h *Hub[T]) JoinWhere(snapshot []T, keep func(T) bool) (*Subscription[T], error) {
	s := &Subscription[T]{hub: h, keep: keep, done: make(chan struct{}), ready: make(chan struct{}, 1)}
	queue := make([]entry[T], len(snapshot))
	var total int64
	for i, it := range snapshot {
		n := h.sizeOf(it)
		queue[i] = entry[T]{item: it, size: n}
		total += n
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.subs) >= h.limits.Subscribers {
		return nil, fmt.Errorf("%d subscribers are open, the limit is %d: %w", len(h.subs), h.limits.Subscribers, ErrTooManySubscribers)
	}
	if h.held+total > h.limits.Bytes {
		return nil, fmt.Errorf("the subscribers hold %d bytes; a snapshot of %d more would pass the limit of %d: %w",
			h.held, total, h.limits.Bytes, ErrTooManySubscribers)
	}
	s.queue, s.queued, s.snapshotLen = queue, total, len(snapshot)
	h.held += total
	h.subs[s] = struct{}{}
	if h.isClosed {
		s.finishLocked(h.closeErr)
	}
	return s, nil
}

// Subscribe registers a subscriber for items published from now on, with
// no snapshot. When the hub refuses it (see Join) it returns a
// subscription that has already ended with the refusal as its Err.
func (h *Hub[T]) Subscribe() *Subscription[T] {
	s, err := h.Join(nil)
	if err != nil {
		s = &Subscription[T]{hub: h, done: make(chan struct{}), ready: make(chan struct{}, 1)}
		h.mu.Lock()
		s.finishLocked(err)
		h.mu.Unlock()
	}
	return s
}

func (h *Hub[T]) sizeOf(item T) int64 {
	if h.size == nil {
		return 0
	}
	return int64(h.size(item))
}

// Len returns the number of subscribers.
func (h *Hub[T]) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Stats returns the hub's subscribers, the bytes they hold and how many
// were closed for a bound.
func (h *Hub[T]) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return Stats{Subscribers: len(h.subs), Held: h.held, Closed: h.closed}
}

// Publish sends item to every subscriber without blocking. A subscriber
// past its own bounds is closed with ErrSlow; when the item does not fit in
// the hub's byte budget, the subscribers holding the most are closed with
// ErrOverBudget until it does.
func (h *Hub[T]) Publish(item T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.sizeOf(item)
	for s := range h.subs {
		if s.dropped || s.ended || !s.takes(item) {
			continue
		}
		if s.items+1 > h.limits.Items || s.live+n > h.limits.SubscriberBytes {
			h.dropLocked(s, fmt.Errorf("%d items (%d bytes) wait for it, the limit is %d items or %d bytes: %w",
				s.items, s.live, h.limits.Items, h.limits.SubscriberBytes, ErrSlow))
			continue
		}
		for h.held+n > h.limits.Bytes && !s.dropped {
			victim := s
			for o := range h.subs {
				if !o.dropped && o.queued > victim.queued {
					victim = o
				}
			}
			h.dropLocked(victim, fmt.Errorf("the subscribers hold %d bytes, the limit is %d, and this one held %d: %w",
				h.held, h.limits.Bytes, victim.queued, ErrOverBudget))
		}
		if s.dropped {
			continue
		}
		s.queue = append(s.queue, entry[T]{item: item, size: n, live: true})
		s.items++
		s.live += n
		s.queued += n
		h.held += n
		s.signal()
	}
}

// Wanted reports whether a subscriber open now would take item if it were
// published: a publisher whose items cost something to build may skip
// those that nobody would receive.
func (h *Hub[T]) Wanted(item T) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		if !s.dropped && !s.ended && s.takes(item) {
			return true
		}
	}
	return false
}

// takes reports whether s takes item. Called with the hub's lock held.
func (s *Subscription[T]) takes(item T) bool { return s.keep == nil || s.keep(item) }

// dropLocked closes s for a bound: its queue is dropped and its bytes
// given back now; Next returns err at once.
func (h *Hub[T]) dropLocked(s *Subscription[T], err error) {
	if s.dropped {
		return
	}
	h.closed++
	s.dropped = true
	h.held -= s.queued
	s.queue, s.head, s.queued, s.items, s.live = nil, 0, 0, 0, 0
	s.finishLocked(err)
}

// Close ends every subscription with err (nil for a clean end). What is
// queued is still delivered, then Next returns err. A subscription joined
// later ends the same way after its snapshot.
func (h *Hub[T]) Close(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.isClosed {
		h.isClosed, h.closeErr = true, err
	}
	for s := range h.subs {
		s.finishLocked(err)
	}
}

// finishLocked marks s ended with err (the first reason wins).
func (s *Subscription[T]) finishLocked(err error) {
	s.once.Do(func() {
		s.err = err
		s.ended = true
		close(s.done)
		s.signal()
	})
}

func (s *Subscription[T]) signal() {
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// Next returns the subscription's next item: the snapshot's first
// (SnapshotLen of them), then live items, waiting for one until ctx ends.
// The item's bytes stay held until the next call (or Close), so the item
// being sent counts against the budget. Once the subscription ended and
// what was queued is taken (a subscriber closed for a bound has nothing
// queued), Next returns Err, or ErrClosed for a clean end.
func (s *Subscription[T]) Next(ctx context.Context) (item T, err error) {
	h := s.hub
	for {
		h.mu.Lock()
		h.held -= s.inFlight
		s.inFlight = 0
		if s.head < len(s.queue) {
			e := s.queue[s.head]
			s.queue[s.head] = entry[T]{}
			s.head++
			s.queued -= e.size
			s.inFlight = e.size
			if e.live {
				s.items--
				s.live -= e.size
			}
			if s.head == len(s.queue) {
				// Drained: give the queue's memory back.
				s.queue, s.head = nil, 0
			}
			h.mu.Unlock()
			return e.item, nil
		}
		if s.ended {
			err := s.err
			h.mu.Unlock()
			if err == nil {
				err = ErrClosed
			}
			return item, err
		}
		h.mu.Unlock()
		select {
		case <-s.ready:
		case <-ctx.Done():
			return item, ctx.Err()
		}
	}
}

// ErrClosed is what Next returns after a subscription ended cleanly.
var ErrClosed = errors.New("subscription closed")

// Close unsubscribes and gives back what the subscription holds. It is safe
// to call more than once.
func (s *Subscription[T]) Close() {
	h := s.hub
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.subs, s)
	h.held -= s.queued + s.inFlight
	s.queue, s.head, s.queued, s.inFlight, s.items, s.live = nil, 0, 0, 0, 0, 0
	s.finishLocked(nil)
}

// Err returns why the subscription ended (nil for a clean end); it waits
// until it has.
func (s *Subscription[T]) Err() error {
	<-s.done
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	return s.err
}

// Done is closed when the subscription ends.
func (s *Subscription[T]) Done() <-chan struct{} { return s.done }

// SnapshotLen returns the number of items the subscription's snapshot had.
func (s *Subscription[T]) SnapshotLen() int { return s.snapshotLen }
