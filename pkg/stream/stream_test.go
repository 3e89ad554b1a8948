package stream

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"testing"

	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// A subscriber past its bound is closed with ErrSlow while the others,
// which keep up, go on receiving.
func TestSlowSubscriberIsDroppedOthersContinue(t *testing.T) {
	h := NewBoundedHub[int](Limits{Items: 4}, nil)
	slow := h.Subscribe()
	fast := h.Subscribe()
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		h.Publish(i)
		v, err := fast.Next(ctx)
		if err != nil || v != i {
			t.Fatalf("fast got %d, %v; want %d", v, err, i)
		}
	}
	if _, err := slow.Next(ctx); !errors.Is(err, ErrSlow) {
		t.Fatalf("slow subscriber: Next = %v, want ErrSlow", err)
	}
	if !errors.Is(slow.Err(), ErrSlow) {
		t.Fatalf("slow.Err() = %v, want ErrSlow", slow.Err())
	}
	slow.Close()
	if h.Len() != 1 {
		t.Fatalf("hub has %d subscribers, want 1", h.Len())
	}
	fast.Close()
	fast.Close()
	if fast.Err() != nil || h.Len() != 0 {
		t.Fatalf("after Close: err %v, subscribers %d", fast.Err(), h.Len())
	}
}

func size(s string) int { return len(s) }

// Serve sends the snapshot, the synced marker, then the live items, and
// returns nil when the hub closes cleanly; what a subscriber held is given
// back.
func TestServeOrder(t *testing.T) {
	h := NewBoundedHub(Limits{}, size)
	sub, err := h.Join([]string{"snap1", "snap2"})
	if err != nil {
		t.Fatal(err)
	}
	h.Publish("live1")
	h.Publish("live2")
	if got := h.Stats().Held; got != int64(len("snap1snap2live1live2")) {
		t.Fatalf("held %d bytes", got)
	}
	h.Close(nil)
	var out []string
	send := func(s string) error { out = append(out, s); return nil }
	synced := func() error { out = append(out, "synced"); return nil }
	if err := Serve(context.Background(), sub, send, synced); err != nil {
		t.Fatalf("Serve = %v", err)
	}
	want := []string{"snap1", "snap2", "synced", "live1", "live2"}
	if len(out) != len(want) {
		t.Fatalf("sent %v, want %v", out, want)
	}
	for i := range want {
		if out[i] != want[i] {
			t.Fatalf("sent %v, want %v", out, want)
		}
	}
	if st := h.Stats(); st.Subscribers != 0 || st.Held != 0 {
		t.Fatalf("after Serve: %+v", st)
	}
}

// A subscriber past its own bounds, in items or in bytes, is closed with
// ErrSlow: what it had queued is dropped at once and its bytes given back,
// and Serve returns the plain error (the interceptor maps it).
func TestSubscriberBounds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits Limits
		items  []string
	}{
		{"items", Limits{Items: 2}, []string{"a", "b", "c"}},
		{"bytes", Limits{SubscriberBytes: 10}, []string{"12345", "12345", "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := NewBoundedHub(tc.limits, size)
			sub, err := h.Join([]string{"snap"})
			if err != nil {
				t.Fatal(err)
			}
			for _, it := range tc.items {
				h.Publish(it)
			}
			if st := h.Stats(); st.Held != 0 || st.Closed != 1 {
				t.Fatalf("after the overflow: %+v, want nothing held and one closed", st)
			}
			var sent []string
			err = Serve(context.Background(), sub, func(s string) error { sent = append(sent, s); return nil }, func() error { return nil })
			if !errors.Is(err, ErrSlow) || !errors.Is(err, errdefs.ErrResourceExhausted) {
				t.Fatalf("Serve = %v, want ErrSlow", err)
			}
			if _, ok := status.FromError(err); ok {
				t.Fatalf("Serve error %v is a gRPC status; the interceptor maps errors", err)
			}
			if len(sent) != 0 {
				t.Fatalf("sent %v after the subscriber was closed", sent)
			}
			if h.Len() != 0 {
				t.Fatal("subscription not removed")
			}
		})
	}
}

// The hub refuses a subscriber past its count, and one whose snapshot does
// not fit in the bytes left; a closed subscription makes room again.
func TestJoinRefusals(t *testing.T) {
	h := NewBoundedHub(Limits{Subscribers: 2, Bytes: 100}, size)
	a, err := h.Join(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.Join([]string{string(make([]byte, 60))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Join(nil); !errors.Is(err, ErrTooManySubscribers) || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("third Join = %v, want ErrTooManySubscribers", err)
	}
	if s := h.Subscribe(); !errors.Is(s.Err(), ErrTooManySubscribers) {
		t.Fatalf("refused Subscribe ended with %v", s.Err())
	} else {
		s.Close()
	}
	a.Close()
	if _, err := h.Join([]string{string(make([]byte, 41))}); !errors.Is(err, ErrTooManySubscribers) {
		t.Fatalf("Join with a snapshot past the bytes left = %v", err)
	}
	c, err := h.Join([]string{string(make([]byte, 40))})
	if err != nil {
		t.Fatalf("Join with a snapshot that fits = %v", err)
	}
	b.Close()
	c.Close()
	if st := h.Stats(); st.Subscribers != 0 || st.Held != 0 {
		t.Fatalf("after closing all: %+v", st)
	}
}

// When the subscribers together would pass the hub's byte budget, the one
// holding the most is closed with ErrOverBudget, and a reader that keeps up
// gets every item; the hub never holds more than its budget.
func TestByteBudgetClosesTheLargestHolder(t *testing.T) {
	const item, budget = 100, 1000
	h := NewBoundedHub(Limits{Bytes: budget}, size)
	stalled, err := h.Join(nil)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := h.Join(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 50 {
		h.Publish(string(rune('a'+i%26)) + string(make([]byte, item-1)))
		if held := h.Stats().Held; held > budget {
			t.Fatalf("hub holds %d bytes, past its budget of %d", held, budget)
		}
		got, err := reader.Next(ctx)
		if err != nil {
			t.Fatalf("reader: item %d: %v", i, err)
		}
		if got[0] != byte('a'+i%26) {
			t.Fatalf("reader got item %q, want %d", got[:1], i)
		}
	}
	select {
	case <-stalled.Done():
	default:
		t.Fatal("the stalled subscriber is still open")
	}
	if err := stalled.Err(); !errors.Is(err, ErrOverBudget) || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("stalled subscriber ended with %v, want ErrOverBudget", err)
	}
	stalled.Close()
	if st := h.Stats(); st.Subscribers != 1 || st.Held != item || st.Closed != 1 {
		t.Fatalf("stats %+v, want the reader alone holding the item it is sending", st)
	}
	reader.Close()
	if st := h.Stats(); st.Held != 0 {
		t.Fatalf("after closing the reader the hub holds %d bytes", st.Held)
	}
}

// A drained queue gives its memory back.
func TestDrainedQueueIsFreed(t *testing.T) {
	h := NewBoundedHub(Limits{}, size)
	sub, err := h.Join(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for range 1000 {
		h.Publish("x")
	}
	for range 1000 {
		if _, err := sub.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	h.mu.Lock()
	queue := sub.queue
	h.mu.Unlock()
	if queue != nil {
		t.Fatalf("drained queue keeps a backing array of %d items", cap(queue))
	}
}

func TestServeEndsWithContext(t *testing.T) {
	h := NewBoundedHub(Limits{}, size)
	sub, err := h.Join(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = Serve(ctx, sub, func(string) error { return nil }, func() error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve = %v, want context.Canceled", err)
	}
	if h.Len() != 0 {
		t.Fatal("subscription not removed")
	}
}

// A subscriber that joins a closed hub gets its snapshot, then the end.
func TestJoinAfterClose(t *testing.T) {
	stopped := errors.New("stopped")
	h := NewBoundedHub(Limits{}, size)
	h.Close(stopped)
	sub, err := h.Join([]string{"snap"})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	err = Serve(context.Background(), sub, func(s string) error { out = append(out, s); return nil }, func() error { return nil })
	if !errors.Is(err, stopped) || len(out) != 1 {
		t.Fatalf("Serve after Close = %v, sent %v", err, out)
	}
	if st := h.Stats(); st.Subscribers != 0 || st.Held != 0 {
		t.Fatalf("after Serve: %+v", st)
	}
}

// heap returns the bytes of live heap objects after a collection.
func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// The memory a stalled subscriber's backlog took is given back when it is
// closed for the budget, while it still has not read anything.
func TestMemoryGivenBack(t *testing.T) {
	const item, budget = 64 << 10, 64 << 20
	h := NewBoundedHub(Limits{Bytes: budget, SubscriberBytes: 2 * budget, Items: 1 << 20}, func(b []byte) int { return len(b) })
	stalled, err := h.Join(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	before := heap()
	for range budget / item {
		h.Publish(make([]byte, item))
	}
	full := heap()
	if full < before+budget*3/4 {
		t.Fatalf("heap grew from %d to %d bytes holding a %d-byte backlog; the test measures nothing", before, full, budget)
	}
	h.Publish(make([]byte, item)) // past the budget: the stalled subscriber is closed
	if err := stalled.Err(); !errors.Is(err, ErrOverBudget) {
		t.Fatalf("stalled subscriber: %v, want ErrOverBudget", err)
	}
	if after := heap(); after > before+budget/8 {
		t.Fatalf("heap %d bytes before the backlog, %d with it, %d after the subscriber was closed", before, full, after)
	}
}

// A subscriber joined with a filter gets its whole snapshot and only the
// live items the filter keeps, and holds no bytes for the others; Wanted
// says whether any open subscriber would take an item.
func TestJoinWhereFilters(t *testing.T) {
	short := func(s string) bool { return len(s) < 4 }
	for _, tc := range []struct {
		name string
		hub  *Hub[string]
	}{
		{"bounded", NewBoundedHub(Limits{}, size)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.hub
			if h.Wanted("a") {
				t.Fatal("Wanted with no subscriber")
			}
			some, err := h.JoinWhere([]string{"snapshot"}, short)
			if err != nil {
				t.Fatal(err)
			}
			if !h.Wanted("a") || h.Wanted("long") {
				t.Fatalf("Wanted with a filtering subscriber: a %v, long %v; want true, false", h.Wanted("a"), h.Wanted("long"))
			}
			all, err := h.Join(nil)
			if err != nil {
				t.Fatal(err)
			}
			if !h.Wanted("long") {
				t.Fatal("Wanted(long) false with a subscriber that takes everything")
			}
			for _, it := range []string{"a", "long", "bb", "longer"} {
				h.Publish(it)
			}
			// The filtered subscriber holds its snapshot, "a" and "bb"; the
			// other one every item.
			if want := int64(len("snapshot"+"a"+"bb") + len("a"+"long"+"bb"+"longer")); h.Stats().Held != want {
				t.Fatalf("held %d bytes, want %d", h.Stats().Held, want)
			}
			h.Close(nil)
			var got, gotAll []string
			if err := Serve(context.Background(), some, func(s string) error { got = append(got, s); return nil }, func() error { return nil }); err != nil {
				t.Fatal(err)
			}
			if err := Serve(context.Background(), all, func(s string) error { gotAll = append(gotAll, s); return nil }, func() error { return nil }); err != nil {
				t.Fatal(err)
			}
			if want := []string{"snapshot", "a", "bb"}; !slices.Equal(got, want) {
				t.Fatalf("filtered subscriber got %v, want %v", got, want)
			}
			if want := []string{"a", "long", "bb", "longer"}; !slices.Equal(gotAll, want) {
				t.Fatalf("unfiltered subscriber got %v, want %v", gotAll, want)
			}
			if h.Wanted("a") {
				t.Fatal("Wanted after every subscription ended")
			}
		})
	}
}
