// Package clock abstracts time for the reconciler's backoff, resync and
// budgets, so tests can drive them by order and state instead of wall time.
package clock

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Clock tells the time and runs functions later. Implementations are safe
// for concurrent use.
type Clock interface {
	Now() time.Time
	// AfterFunc runs f in its own goroutine once d has passed.
	AfterFunc(d time.Duration, f func()) Timer
	// WithTimeout returns a copy of ctx that ends once d has passed on this
	// clock; context.Cause then returns context.DeadlineExceeded. The
	// caller must call the CancelFunc when done.
	WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc)
}

// Timer is a pending AfterFunc.
type Timer interface {
	// Stop prevents the function from running; it reports whether it did.
	Stop() bool
}

// Real is the wall clock.
type Real struct{}

var _ Clock = Real{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

// WithTimeout is context.WithTimeout: the deadline also travels with the
// RPCs made under the context.
func (Real) WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d)
}

// Fake is a manual clock for tests: time moves only with Advance, which runs
// the functions that became due.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
}

var _ Clock = (*Fake)(nil)

// NewFake returns a fake clock set to now.
func NewFake(now time.Time) *Fake { return &Fake{now: now} }

type fakeTimer struct {
	c   *Fake
	at  time.Time
	f   func()
	off bool
}

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := !t.off
	t.off = true
	return was
}

// Now returns the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f at Now()+d.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// WithTimeout returns a context that ends when Advance moves the clock d
// past now, with context.DeadlineExceeded as its cause. It carries no
// deadline: outgoing RPCs are not bounded by wall time either.
func (c *Fake) WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(ctx)
	t := c.AfterFunc(d, func() { cancel(context.DeadlineExceeded) })
	return ctx, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// Advance moves time forward by d and runs, in their own goroutines, the
// functions that became due.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	c.timers = slices.DeleteFunc(c.timers, func(t *fakeTimer) bool {
		if t.off {
			return true
		}
		if !t.at.After(c.now) {
			t.off = true
			due = append(due, t)
			return true
		}
		return false
	})
	c.mu.Unlock()
	for _, t := range due {
		go t.f()
	}
}

// Due returns the number of pending timers that Advance(d) would run.
func (c *Fake) Due(d time.Duration) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, t := range c.timers {
		if !t.off && !t.at.After(c.now.Add(d)) {
			n++
		}
	}
	return n
}
