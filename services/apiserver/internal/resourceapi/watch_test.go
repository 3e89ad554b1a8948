package resourceapi

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// TestWatchSelectorTransitions: through a label selector, an object that
// starts to match is ADDED, changes while matching are MODIFIED, one that
// stops matching is DELETED, and changes while it does not match are not
// sent.
func TestWatchSelectorTransitions(t *testing.T) {
	a := startAPI(t, Limits{})
	c := a.client("internal", RoleInternal).ResourceV1().ResourceSlices()
	ctx := context.Background()
	w, err := c.Watch(ctx, metav1.ListOptions{LabelSelector: "pick=yes"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	s, err := c.Create(ctx, slice("s"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		label string
		want  watch.EventType // "": nothing sent
	}{{"yes", watch.Added}, {"yes", watch.Modified}, {"no", watch.Deleted}, {"no", ""}, {"yes", watch.Added}}
	for i, step := range steps {
		s.Labels = map[string]string{"pick": step.label, "step": string(rune('a' + i))}
		if s, err = c.Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if step.want == "" {
			continue
		}
		ev := next(t, w)
		got := ev.Object.(*resourcev1.ResourceSlice)
		if ev.Type != step.want || got.ResourceVersion != s.ResourceVersion {
			t.Fatalf("step %d: %s at %s, want %s at %s", i, ev.Type, got.ResourceVersion, step.want, s.ResourceVersion)
		}
	}
	if err := c.Delete(ctx, "s", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, w); ev.Type != watch.Deleted {
		t.Fatalf("after the delete: %s", ev.Type)
	}
}

// TestWatchBookmarks: a watch that allows bookmarks gets them at the
// resourceVersion it is at; a watch-list request gets its initial
// objects, then the bookmark that ends them.
func TestWatchBookmarks(t *testing.T) {
	a := startAPI(t, Limits{}, func(c *Config) { c.BookmarkInterval = 20 * time.Millisecond })
	c := a.client("internal", RoleInternal).ResourceV1().ResourceSlices()
	ctx := context.Background()
	if _, err := c.Create(ctx, slice("s"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(ctx, metav1.ListOptions{SendInitialEvents: ptr.To(true), AllowWatchBookmarks: true,
		ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if ev := next(t, w); ev.Type != watch.Added {
		t.Fatalf("first event %s, want the initial ADDED", ev.Type)
	}
	end := next(t, w)
	m := end.Object.(*resourcev1.ResourceSlice)
	if end.Type != watch.Bookmark || m.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
		t.Fatalf("after the initial events: %s %v, want the initial-events-end bookmark", end.Type, m.Annotations)
	}
	other := a.client("internal", RoleInternal).ResourceV1().DeviceClasses()
	if _, err := other.Create(ctx, &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := a.st.ResourceVersion()
	testutil.WaitFor(t, "a bookmark at the resourceVersion of the last write (of another kind)", func() bool {
		ev := next(t, w)
		return ev.Type == watch.Bookmark && ev.Object.(*resourcev1.ResourceSlice).ResourceVersion == itoa(want)
	})
}

// TestWatchLimits: beyond the watches per caller, or in total, a watch is
// 429 with a message naming the bound and its number; a closed watch
// gives its slot back.
func TestWatchLimits(t *testing.T) {
	a := startAPI(t, Limits{MaxWatches: 3, MaxWatchesPerCaller: 2})
	ctx := context.Background()
	driver := a.client("driver", RoleDriver).ResourceV1().ResourceSlices()
	reader := a.client("reader", RoleReader).ResourceV1().ResourceSlices()
	var open []watch.Interface
	defer func() {
		for _, w := range open {
			w.Stop()
		}
	}()
	for range 2 {
		w, err := driver.Watch(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, w)
	}
	_, err := driver.Watch(ctx, metav1.ListOptions{})
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "driver already has 2 watches open, the limit per caller") {
		t.Fatalf("a third watch of one caller: %v, want 429 per caller", err)
	}
	w, err := reader.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	open = append(open, w)
	_, err = reader.Watch(ctx, metav1.ListOptions{})
	if !apierrors.IsTooManyRequests(err) || !strings.Contains(err.Error(), "3 watches are open, the limit in total") {
		t.Fatalf("a fourth watch: %v, want 429 in total", err)
	}
	if a.metric("nodeplug_resource_api_watches_refused_total", "bound=per_caller") != 1 || a.metric("nodeplug_resource_api_watches_refused_total", "bound=total") != 1 {
		t.Fatal("the refusals were not counted by their bound")
	}
	open[0].Stop()
	testutil.Eventually(t, "a slot given back", func() error {
		w, err := reader.Watch(ctx, metav1.ListOptions{})
		if err == nil {
			open = append(open, w)
		}
		return err
	})
}

// TestSlowWatcherCutOffOverHTTP: a client that never reads its watch, on
// HTTP/1.1 (its kernel stops taking data) or through client-go on HTTP/2
// (flow control stops the stream), is cut off once it falls a buffer
// behind, counted and logged, while other clients' lists and watches are
// served throughout; the server holds nothing of it afterwards.
func TestSlowWatcherCutOffOverHTTP(t *testing.T) {
	a := startAPI(t, Limits{WatchBufferBytes: MaxObjectBytes, HistoryBytes: 64 << 20})
	ctx := context.Background()
	cfg := a.config("driver", RoleDriver)
	status, _ := a.silentWatch(cfg, "")
	if !strings.Contains(status, " 200 ") {
		t.Fatalf("silent watch: %s", status)
	}
	unread, err := a.watchClient("driver", RoleDriver).ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer unread.Stop()
	c := a.client("internal", RoleInternal).ResourceV1().ResourceSlices()
	live, err := a.watchClient("internal", RoleInternal).ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Stop()
	testutil.WaitFor(t, "three watches open", func() bool { return a.metric("nodeplug_resource_api_watches") == 3 })
	for i := 0; a.metric("nodeplug_resource_api_watch_cutoffs_total", "bound="+boundBytes) < 2; i++ {
		if i > 200 {
			t.Fatal("the watches that never read were not cut off")
		}
		s := slice("big", "d0")
		s.Spec.Devices[0].Taints = []resourcev1.DeviceTaint{{Key: "pad", Value: strings.Repeat("x", 512<<10), Effect: resourcev1.DeviceTaintEffectNoSchedule}}
		s.Labels = map[string]string{"i": itoa(uint64(i))}
		if i == 0 {
			_, err = c.Create(ctx, s, metav1.CreateOptions{})
		} else {
			_, err = c.Update(ctx, s, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.List(ctx, metav1.ListOptions{}); err != nil {
			t.Fatalf("a list while a watch is blocked: %v", err)
		}
		if ev := next(t, live); ev.Type != watch.Added && ev.Type != watch.Modified {
			t.Fatalf("the live watch got %s", ev.Type)
		}
	}
	testutil.WaitFor(t, "the cut-off watch closed", func() bool { return a.metric("nodeplug_resource_api_watches") == 1 })
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
