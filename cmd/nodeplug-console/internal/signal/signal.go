// Package signal wakes the console's live views when what they show changes.
package signal

import "sync"

// Signal tells waiters that something changed. Each Broadcast closes the
// channel the waiters hold and hands out a new one, so a waiter that looks
// after a change sees the next one, and none is missed between reading the
// state and waiting.
//
// A Signal is safe for concurrent use; the zero value is ready.
type Signal struct {
	mu sync.Mutex
	ch chan struct{}
}

// C returns a channel closed at the next Broadcast.
func (s *Signal) C() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// Broadcast wakes every waiter of C.
func (s *Signal) Broadcast() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}
