package stream

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// take takes n slots for caller and fails the test on a refusal.
func take(t *testing.T, s *Slots, caller string, privileged bool, n int) []func() {
	t.Helper()
	var out []func()
	for i := 0; i < n; i++ {
		release, err := s.Take(caller, privileged)
		if err != nil {
			t.Fatalf("slot %d of %s refused: %v", i+1, caller, err)
		}
		out = append(out, release)
	}
	return out
}

// refused takes one more slot, expects a refusal wrapping want and
// errdefs.ErrResourceExhausted, and returns its text.
func refused(t *testing.T, s *Slots, caller string, privileged bool, want error) string {
	t.Helper()
	release, err := s.Take(caller, privileged)
	if err == nil {
		release()
		t.Fatalf("%s got a slot past the bound (%+v)", caller, s.Stats())
	}
	if !errors.Is(err, want) || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("%s refused with %v, want it to wrap %v and resource exhausted", caller, err, want)
	}
	return err.Error()
}

// One caller holds PerCaller streams at most, however many are free; the
// refusal names the bound, the caller and the numbers, and another caller
// still gets in.
func TestSlotsPerCallerBound(t *testing.T) {
	s := NewSlots(SlotLimits{Total: 20, PerCaller: 3, Reserved: 4})
	take(t, s, "uid 1000", false, 3)
	msg := refused(t, s, "uid 1000", false, ErrPerCallerBound)
	for _, want := range []string{"per-caller bound", "uid 1000 holds 3 watch streams", "the limit per caller is 3"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	take(t, s, "uid 1001", false, 3)
	take(t, s, `certificate "CN=monitor"`, false, 3)
	if st := s.Stats(); st.Open != 9 || st.Shared != 9 || st.Callers != 3 {
		t.Fatalf("stats %+v, want 9 open, 9 shared, 3 callers", st)
	}
}

// Callers that are not privileged together hold Total − Reserved at most,
// each under its per-caller bound; the kept slots go to privileged callers,
// which no per-caller bound stops, until the total.
func TestSlotsReservedAndTotal(t *testing.T) {
	s := NewSlots(SlotLimits{Total: 10, PerCaller: 2, Reserved: 4})
	for i := 0; i < 3; i++ {
		take(t, s, "uid "+string(rune('a'+i)), false, 2)
	}
	msg := refused(t, s, "uid z", false, ErrTotalBound)
	for _, want := range []string{"total bound", "hold 6 watch streams", "the limit is 6", "10 in total", "4 kept for the services"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	// The services' own uid takes every kept slot, more than a caller's
	// bound, and a second privileged caller shares them.
	take(t, s, "uid 0", true, 3)
	take(t, s, "uid 990", true, 1)
	msg = refused(t, s, "uid 0", true, ErrTotalBound)
	if want := "total bound: 10 watch streams are open, the limit is 10"; !strings.Contains(msg, want) {
		t.Errorf("refusal %q does not say %q", msg, want)
	}
	// At the total, a caller under its own bound is refused for the total.
	refused(t, s, "uid new", false, ErrTotalBound)
	if st := s.Stats(); st.Open != 10 || st.Shared != 6 || st.Callers != 3 {
		t.Fatalf("stats %+v, want 10 open, 6 shared, 3 callers", st)
	}
}

// Privileged callers may hold every slot, the shared ones too: the bound
// keeps slots for them, not from them.
func TestSlotsPrivilegedTakeShared(t *testing.T) {
	s := NewSlots(SlotLimits{Total: 5, PerCaller: 1, Reserved: 1})
	take(t, s, "uid 0", true, 5)
	refused(t, s, "uid 1000", false, ErrTotalBound)
}

// A slot given back is free again for its caller and counts nowhere;
// giving it back twice changes nothing; a caller whose streams all ended
// leaves no entry behind.
func TestSlotsRelease(t *testing.T) {
	s := NewSlots(SlotLimits{Total: 4, PerCaller: 2, Reserved: 1})
	a := take(t, s, "uid 1000", false, 2)
	p := take(t, s, "uid 0", true, 1)
	refused(t, s, "uid 1000", false, ErrPerCallerBound)
	a[0]()
	a[0]()
	if got := s.Held("uid 1000"); got != 1 {
		t.Fatalf("uid 1000 holds %d after one release (twice), want 1", got)
	}
	a = append(a[1:], take(t, s, "uid 1000", false, 1)...)
	for _, r := range append(a, p...) {
		r()
	}
	if st := s.Stats(); st != (SlotStats{}) {
		t.Fatalf("stats %+v after every release, want none", st)
	}
	take(t, s, "uid 1001", false, 2)
	take(t, s, "uid 0", true, 2)
}

// Concurrent takes never pass a bound, and every slot comes back.
func TestSlotsConcurrent(t *testing.T) {
	l := SlotLimits{Total: 16, PerCaller: 3, Reserved: 4}
	s := NewSlots(l)
	var wg sync.WaitGroup
	// What the takers hold by their own count: raised after a Take,
	// lowered before the release, so never above what the slots count.
	var open, shared atomic.Int64
	var perCaller [8]atomic.Int64
	for c := 0; c < 8; c++ {
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func(c int, privileged bool) {
				defer wg.Done()
				caller := fmt.Sprintf("uid %d", 1000+c)
				for i := 0; i < 300; i++ {
					release, err := s.Take(caller, privileged)
					if err != nil {
						runtime.Gosched()
						continue
					}
					if n := open.Add(1); n > int64(l.Total) {
						t.Errorf("%d streams open, the total is %d", n, l.Total)
					}
					if !privileged {
						if n := shared.Add(1); n > int64(l.Shared()) {
							t.Errorf("%d shared streams open, the limit is %d", n, l.Shared())
						}
						if n := perCaller[c].Add(1); n > int64(l.PerCaller) {
							t.Errorf("%s holds %d streams, the limit is %d", caller, n, l.PerCaller)
						}
					}
					runtime.Gosched()
					if !privileged {
						perCaller[c].Add(-1)
						shared.Add(-1)
					}
					open.Add(-1)
					release()
				}
			}(c, c == 0)
		}
	}
	wg.Wait()
	if st := s.Stats(); st != (SlotStats{}) {
		t.Fatalf("stats %+v after every release, want none", st)
	}
}

func TestSlotLimitsDefaults(t *testing.T) {
	if got := (SlotLimits{}).WithDefaults(); got != DefaultSlotLimits {
		t.Errorf("zero limits take %+v, want %+v", got, DefaultSlotLimits)
	}
	if got := (SlotLimits{Total: 4, Reserved: 9}).WithDefaults(); got.Reserved != 3 || got.Shared() != 1 {
		t.Errorf("reserving more than the total gives %+v, want 3 kept and 1 shared", got)
	}
	if DefaultSlotLimits.Total != DefaultSubscribers {
		t.Errorf("the slots' total %d is not a hub's %d", DefaultSlotLimits.Total, DefaultSubscribers)
	}
}
