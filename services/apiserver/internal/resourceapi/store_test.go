package resourceapi

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

func openStore(t *testing.T, lim Limits) *Store {
	t.Helper()
	st, err := OpenStore(filepath.Join(t.TempDir(), "api.db"), lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func del(t *testing.T, st *Store, k *kind, key string) {
	t.Helper()
	if _, err := st.mutate(k, key, func(runtime.Object) (runtime.Object, error) { return nil, nil }); err != nil {
		t.Fatal(err)
	}
}

// padded is a slice whose encoding is about n bytes.
func padded(name string, n int) *resourcev1.ResourceSlice {
	s := testSlice(name)
	s.Annotations = map[string]string{"pad": strings.Repeat("x", n)}
	return s
}

// TestMutateEvents: a create is ADDED, a replace MODIFIED, a delete
// DELETED carrying the last state at the deletion's resourceVersion; a
// mutation that changes nothing writes nothing.
func TestMutateEvents(t *testing.T) {
	st := openStore(t, Limits{})
	w, _, err := st.subscribe(kindSlice, watchStart{from: st.ResourceVersion()}, "t", nil)
	if err != nil {
		t.Fatal(err)
	}
	put(t, st, testSlice("a"))
	s := testSlice("a")
	s.Labels = map[string]string{"x": "1"}
	put(t, st, s)
	rv := st.ResourceVersion()
	if _, err := st.mutate(kindSlice, "a", func(runtime.Object) (runtime.Object, error) { return nil, errNoChange }); err != nil || st.ResourceVersion() != rv {
		t.Fatalf("a mutation without change: %v, resourceVersion %d → %d", err, rv, st.ResourceVersion())
	}
	del(t, st, kindSlice, "a")
	evs, head, _, ok := st.pending(w)
	if !ok || len(evs) != 3 || head != rv+1 {
		t.Fatalf("%d events up to %d (ok %v), want 3 up to %d", len(evs), head, ok, rv+1)
	}
	for i, want := range []watch.EventType{watch.Added, watch.Modified, watch.Deleted} {
		if evs[i].typ != want {
			t.Errorf("event %d is %s, want %s", i, evs[i].typ, want)
		}
	}
	d := evs[2]
	if d.cur != nil || d.prev == nil || d.prev.labels["x"] != "1" || !strings.Contains(string(d.data), `"resourceVersion":"`+strconv.FormatUint(rv+1, 10)+`"`) {
		t.Fatalf("DELETED event: prev %v cur %v data %s", d.prev, d.cur, d.data)
	}
	if objs, _ := st.list(kindSlice, func(runtime.Object) bool { return true }); len(objs) != 0 {
		t.Fatalf("%d slices after the delete", len(objs))
	}
}

// TestObjectTooLarge: an object over MaxObjectBytes encoded is 413 and
// not written.
func TestObjectTooLarge(t *testing.T) {
	st := openStore(t, Limits{})
	rv := st.ResourceVersion()
	_, err := st.mutate(kindSlice, "big", func(runtime.Object) (runtime.Object, error) { return padded("big", MaxObjectBytes), nil })
	if !apierrors.IsRequestEntityTooLargeError(err) || !strings.Contains(err.Error(), strconv.Itoa(MaxObjectBytes)) {
		t.Fatalf("an object over the limit: %v, want 413 naming %d", err, MaxObjectBytes)
	}
	if st.ResourceVersion() != rv || st.get(kindSlice, "big") != nil {
		t.Fatal("the object over the limit was written")
	}
	put(t, st, padded("big", MaxObjectBytes-4096))
}

// TestHistoryBounds: the history keeps at most its events, its bytes and
// its age; a watch from before what it dropped of its kind is 410 Gone,
// while a watch of a kind whose changes are all kept is served; deleted
// objects leave with their events.
func TestHistoryBounds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		lim    Limits
		expire bool
	}{
		{"events", Limits{HistoryEvents: 3}, false},
		{"bytes", Limits{HistoryBytes: 4 << 20, WatchBufferBytes: 2 << 20}, false},
		{"age", Limits{HistoryAge: time.Minute}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := openStore(t, tc.lim)
			lim := st.Limits()
			start := st.ResourceVersion()
			for i := range 6 {
				put(t, st, padded("s"+strconv.Itoa(i), 1<<20))
				del(t, st, kindSlice, "s"+strconv.Itoa(i))
			}
			if tc.expire {
				st.Expire(time.Now().Add(2 * lim.HistoryAge))
			}
			events, size := st.HistorySize()
			if events > lim.HistoryEvents || size > lim.HistoryBytes || (tc.expire && events != 0) {
				t.Fatalf("history of %d events, %d bytes; limits %d, %d", events, size, lim.HistoryEvents, lim.HistoryBytes)
			}
			if _, _, err := st.subscribe(kindSlice, watchStart{from: start}, "t", nil); !apierrors.IsResourceExpired(err) {
				t.Fatalf("a watch from before the dropped changes: %v, want 410", err)
			}
			if _, _, err := st.subscribe(kindClaim, watchStart{from: start}, "t", nil); err != nil {
				t.Fatalf("a watch of claims, none of whose changes were dropped: %v", err)
			}
			if _, _, err := st.subscribe(kindSlice, watchStart{from: st.ResourceVersion()}, "t", nil); err != nil {
				t.Fatalf("a watch from the last resourceVersion: %v", err)
			}
		})
	}
}

// TestSlowWatcherCutOff: a watch that is not sent its events is cut off
// when it falls behind its buffer in events or bytes, or when the
// history drops an event it was not sent; its abort runs; a watch that
// keeps up is never cut off.
func TestSlowWatcherCutOff(t *testing.T) {
	for _, tc := range []struct {
		bound string
		lim   Limits
		size  int
	}{
		{boundEvents, Limits{WatchBufferEvents: 4}, 100},
		{boundBytes, Limits{WatchBufferBytes: 2 << 20}, 1 << 20},
		{boundHistory, Limits{HistoryEvents: 2, WatchBufferEvents: 100}, 100},
	} {
		t.Run(tc.bound, func(t *testing.T) {
			st := openStore(t, tc.lim)
			aborted := make(chan struct{})
			slow, _, err := st.subscribe(kindSlice, watchStart{initial: true}, "slow", func() { close(aborted) })
			if err != nil {
				t.Fatal(err)
			}
			fast, _, _ := st.subscribe(kindSlice, watchStart{initial: true}, "fast", nil)
			for i := 0; ; i++ {
				put(t, st, padded("s", tc.size+i))
				evs, head, _, ok := st.pending(fast)
				if !ok {
					t.Fatalf("the watch that keeps up was cut off (%s)", fast.bound)
				}
				for _, ev := range evs {
					st.sent(fast, ev)
				}
				st.caughtUp(fast, head)
				if _, _, _, ok := st.pending(slow); !ok {
					break
				}
				if i > 100 {
					t.Fatal("the slow watch was never cut off")
				}
			}
			<-slow.cut
			if slow.bound != tc.bound {
				t.Fatalf("cut off for %s (%s), want %s", slow.bound, slow.lag, tc.bound)
			}
			<-aborted
		})
	}
}

// TestCloseEndsWatches: closing the store ends every watch, as stopped.
func TestCloseEndsWatches(t *testing.T) {
	st, err := OpenStore(filepath.Join(t.TempDir(), "api.db"), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	w, _, _ := st.subscribe(kindSlice, watchStart{initial: true}, "t", nil)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	<-w.cut
	if w.bound != boundStopped {
		t.Fatalf("bound %q after Close", w.bound)
	}
}

// TestLimitsValidate: a watch buffer smaller than the largest object, or
// a history smaller than a buffer, is refused.
func TestLimitsValidate(t *testing.T) {
	for _, l := range []Limits{{WatchBufferBytes: MaxObjectBytes - 1}, {HistoryBytes: 4 << 20, WatchBufferBytes: 8 << 20}, {MaxWatches: 2, MaxWatchesPerCaller: 3}} {
		if err := l.Validate(); err == nil {
			t.Errorf("%+v accepted", l)
		}
	}
	if err := (Limits{}).Validate(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	var b Bytes
	if err := b.Set("32Mi"); err != nil || b != 32<<20 {
		t.Fatalf("32Mi: %d %v", b, err)
	}
	if err := b.Set("-1"); err == nil {
		t.Fatal("a negative size accepted")
	}
}
