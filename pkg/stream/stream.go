// Package stream implements the shape every Watch RPC in nodeplug has:
// a snapshot, one synced marker, then live items, with a bounded buffer per
// subscriber. A subscriber that falls behind is dropped with ErrSlow, so one
// stalled client never slows the publisher or the other subscribers.
package stream

import (
	"fmt"
	"sync"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// ErrSlow is the reason a subscription is closed when its buffer overflows.
// It wraps errdefs.ErrResourceExhausted, which the server's error
// interceptor maps to RESOURCE_EXHAUSTED.
var ErrSlow = fmt.Errorf("subscriber fell behind the stream buffer; resubscribe: %w", errdefs.ErrResourceExhausted)

// DefaultBuffer is the number of live items a subscriber may have pending.
const DefaultBuffer = 4096

// Hub fans items out to subscribers. It is safe for concurrent use.
//
// To keep the snapshot and the live items consistent, the owner of the state
// must call Subscribe and Publish while holding the lock that guards its
// state: then no change falls between a snapshot and the live items that
// follow it.
type Hub[T any] struct {
	mu     sync.Mutex
	buffer int
	subs   map[*Subscription[T]]struct{}
}

// NewHub returns a hub whose subscribers buffer up to buffer live items
// (DefaultBuffer when buffer <= 0).
func NewHub[T any](buffer int) *Hub[T] {
	if buffer <= 0 {
		buffer = DefaultBuffer
	}
	return &Hub[T]{buffer: buffer, subs: map[*Subscription[T]]struct{}{}}
}

// Subscription receives live items on C until it is closed. After C is
// closed, Err says why (nil when closed by the subscriber).
type Subscription[T any] struct {
	C <-chan T

	c    chan T
	hub  *Hub[T]
	once sync.Once
	err  error
	done chan struct{}
}

// Subscribe registers a subscriber for items published from now on.
func (h *Hub[T]) Subscribe() *Subscription[T] {
	c := make(chan T, h.buffer)
	s := &Subscription[T]{C: c, c: c, hub: h, done: make(chan struct{})}
	h.mu.Lock()
	h.subs[s] = struct{}{}
	h.mu.Unlock()
	return s
}

// Len returns the number of subscribers.
func (h *Hub[T]) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.subs)
}

// Publish sends item to every subscriber without blocking. A subscriber whose
// buffer is full is closed with ErrSlow.
func (h *Hub[T]) Publish(item T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		select {
		case s.c <- item:
		default:
			delete(h.subs, s)
			s.finish(ErrSlow)
		}
	}
}

// Close closes every subscription with err (nil for a clean end).
func (h *Hub[T]) Close(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for s := range h.subs {
		delete(h.subs, s)
		s.finish(err)
	}
}

func (s *Subscription[T]) finish(err error) {
	s.once.Do(func() {
		s.err = err
		close(s.done)
		close(s.c)
	})
}

// Close unsubscribes. It is safe to call more than once.
func (s *Subscription[T]) Close() {
	s.hub.mu.Lock()
	delete(s.hub.subs, s)
	s.finish(nil)
	s.hub.mu.Unlock()
}

// Err returns why the subscription ended; valid after C is closed.
func (s *Subscription[T]) Err() error {
	<-s.done
	return s.err
}

// Done is closed when the subscription ends.
func (s *Subscription[T]) Done() <-chan struct{} { return s.done }
