package stream

import (
	"fmt"
	"sync"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// Slots count the streams of one Watch RPC by caller, for the bounds of
// DESIGN "Bounds" that a hub cannot keep, since it does not know who
// subscribes: how many streams one caller may hold, and how many of the
// total are kept for privileged callers (the services themselves), which
// the others cannot take.
//
// A privileged caller may take any slot, the kept ones included, and is
// bounded only by the total: the services' own watches always get through
// however many streams the others hold. Every other caller may hold
// PerCaller streams at most, and all of them together Total − Reserved.
//
// Take a slot before the stream joins its hub and give it back after the
// stream ended; a hub sized to Total then never refuses a stream that its
// slot admitted. Slots are safe for concurrent use.
type Slots struct {
	limits SlotLimits

	mu      sync.Mutex
	open    int            // every stream
	shared  int            // streams of callers that are not privileged
	callers map[string]int // streams of each caller that is not privileged
}

// Defaults of SlotLimits. A caller that is not one of the services needs a
// stream or two (nodeplugctl watch, a monitoring agent), so 8 leave room for
// several tools of one user; 16 of the 64 streams kept for the services
// cover the reconciler's one stream per service, the stream of a
// restarted reconciler while the old one's is still being torn down, and
// root's own tools, with room to spare.
const (
	DefaultPerCaller = 8
	DefaultReserved  = 16
)

// SlotLimits bound the streams of one Watch RPC by caller. Zero fields take
// the defaults.
type SlotLimits struct {
	// Total is how many streams may be open at once (DefaultSubscribers,
	// a hub's own bound, when 0).
	Total int
	// PerCaller is how many streams one caller that is not privileged may
	// hold (DefaultPerCaller when 0).
	PerCaller int
	// Reserved streams of Total are kept for privileged callers
	// (DefaultReserved when 0; at most Total − 1, so that others may
	// watch at all).
	Reserved int
}

// DefaultSlotLimits are the bounds a zero SlotLimits takes.
var DefaultSlotLimits = SlotLimits{Total: DefaultSubscribers, PerCaller: DefaultPerCaller, Reserved: DefaultReserved}

// WithDefaults returns l with its zero fields set to the defaults and
// Reserved lowered to Total − 1 when it would leave no slot to others.
func (l SlotLimits) WithDefaults() SlotLimits {
	if l.Total <= 0 {
		l.Total = DefaultSubscribers
	}
	if l.PerCaller <= 0 {
		l.PerCaller = DefaultPerCaller
	}
	if l.Reserved <= 0 {
		l.Reserved = DefaultReserved
	}
	if l.Reserved >= l.Total {
		l.Reserved = l.Total - 1
	}
	return l
}

// Shared is how many streams callers that are not privileged may hold
// together: Total − Reserved.
func (l SlotLimits) Shared() int { return l.Total - l.Reserved }

// The bounds a stream may be refused for. Each wraps
// errdefs.ErrResourceExhausted; a refusal wraps one of them and names the
// caller and the numbers.
var (
	// ErrPerCallerBound: the caller already holds SlotLimits.PerCaller
	// streams.
	ErrPerCallerBound = fmt.Errorf("a caller may hold no more watch streams; close one: %w", errdefs.ErrResourceExhausted)
	// ErrTotalBound: SlotLimits.Total streams are open, or the callers
	// that are not privileged hold every slot not kept for the services.
	ErrTotalBound = fmt.Errorf("the watch streams are at their total bound; retry later: %w", errdefs.ErrResourceExhausted)
)

// NewSlots returns empty slots with limits (see SlotLimits.WithDefaults).
func NewSlots(limits SlotLimits) *Slots {
	return &Slots{limits: limits.WithDefaults(), callers: map[string]int{}}
}

// Take takes a slot for a stream of caller (who the per-caller bound
// counts: a uid, a certificate) and returns the function that gives it
// back; calling it again does nothing. privileged says whether the caller
// may take the kept slots (see Slots). A refusal wraps ErrPerCallerBound
// or ErrTotalBound.
func (s *Slots) Take(caller string, privileged bool) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.limits
	switch {
	case s.open >= l.Total:
		return nil, fmt.Errorf("total bound: %d watch streams are open, the limit is %d: %w", s.open, l.Total, ErrTotalBound)
	case privileged:
	case s.callers[caller] >= l.PerCaller:
		return nil, fmt.Errorf("per-caller bound: %s holds %d watch streams, the limit per caller is %d: %w",
			caller, s.callers[caller], l.PerCaller, ErrPerCallerBound)
	case s.shared >= l.Shared():
		return nil, fmt.Errorf("total bound: callers other than the services hold %d watch streams, the limit is %d "+
			"(%d in total, %d kept for the services): %w", s.shared, l.Shared(), l.Total, l.Reserved, ErrTotalBound)
	}
	s.open++
	if !privileged {
		s.shared++
		s.callers[caller]++
	}
	var once sync.Once
	return func() { once.Do(func() { s.release(caller, privileged) }) }, nil
}

func (s *Slots) release(caller string, privileged bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open--
	if privileged {
		return
	}
	s.shared--
	if s.callers[caller]--; s.callers[caller] <= 0 {
		// A caller's entry lasts as long as its streams: uids and
		// certificates that come and go leave nothing behind.
		delete(s.callers, caller)
	}
}

// SlotStats is a view of the slots taken.
type SlotStats struct {
	// Open is every stream; Shared those of callers that are not
	// privileged.
	Open, Shared int
	// Callers is how many callers that are not privileged hold a stream.
	Callers int
}

// Stats returns the slots taken.
func (s *Slots) Stats() SlotStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return SlotStats{Open: s.open, Shared: s.shared, Callers: len(s.callers)}
}

// Held returns how many streams caller holds (privileged callers' streams
// are not counted by caller).
func (s *Slots) Held(caller string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.callers[caller]
}
