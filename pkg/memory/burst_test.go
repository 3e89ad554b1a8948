package memory

import (
	"testing"
	"time"
)

// TestBurstGivesBackOnceSettled drives the give-back's state with a
// made-up clock: a steady trickle of changes, each sooner than Quiet after
// the last, is never due; once they stop, the burst is due Quiet after the
// last one, once; fewer changes than MinChanges are never due; and a burst
// that settles within Interval of the last give-back waits for it.
func TestBurstGivesBackOnceSettled(t *testing.T) {
	rule := BurstRule{MinChanges: 3, Quiet: time.Second, Interval: 10 * time.Second}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	b := NewBurst(rule)

	// Two changes are not a burst, however long nothing else happens.
	for i := range 2 {
		if b.Changed(at(time.Duration(i)*time.Millisecond), 1) {
			t.Fatalf("change %d started a burst below MinChanges", i+1)
		}
	}
	if _, ok := b.Due(); ok {
		t.Fatal("due with fewer changes than MinChanges")
	}
	if _, ok := b.Take(at(time.Hour)); ok {
		t.Fatal("given back with fewer changes than MinChanges")
	}

	// The third change makes a burst; more keep coming, 900 ms apart: at
	// every change the burst is pending and not due.
	if !b.Changed(at(2*time.Millisecond), 1) {
		t.Fatal("the change that reached MinChanges did not start a burst")
	}
	last := at(2 * time.Millisecond)
	for i := 1; i <= 20; i++ {
		now := last.Add(900 * time.Millisecond)
		if _, ok := b.Take(now); ok {
			t.Fatalf("given back during the burst, at change %d", i)
		}
		if b.Changed(now, 1) {
			t.Fatalf("change %d started a burst again", i)
		}
		last = now
	}
	due, ok := b.Due()
	if !ok || !due.Equal(last.Add(time.Second)) {
		t.Fatalf("due = %v, %v; want Quiet after the last change, %v", due, ok, last.Add(time.Second))
	}
	if _, ok := b.Take(due.Add(-time.Nanosecond)); ok {
		t.Fatal("given back before Quiet had passed")
	}
	n, ok := b.Take(due)
	if !ok || n != 23 {
		t.Fatalf("take at due = %d, %v; want the 23 changes", n, ok)
	}
	if _, ok := b.Take(due.Add(time.Hour)); ok {
		t.Fatal("the same burst given back twice")
	}
	if _, ok := b.Due(); ok {
		t.Fatal("still pending after the give-back")
	}

	// A second burst settles 2 s after the first give-back: it waits for
	// Interval.
	first := due
	for i := range 3 {
		b.Changed(first.Add(time.Second+time.Duration(i)*time.Millisecond), 1)
	}
	if due, _ := b.Due(); !due.Equal(first.Add(10 * time.Second)) {
		t.Fatalf("second burst due at %v, want Interval after the first give-back, %v", due, first.Add(10*time.Second))
	}
	if _, ok := b.Take(first.Add(5 * time.Second)); ok {
		t.Fatal("given back again within Interval")
	}
	if n, ok := b.Take(first.Add(10 * time.Second)); !ok || n != 3 {
		t.Fatalf("second give-back = %d, %v", n, ok)
	}
}
