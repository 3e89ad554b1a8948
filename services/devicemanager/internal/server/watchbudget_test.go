package server

import (
	"context"
	"errors"
	"strings"
	"testing"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// msgOf returns a change message whose cost is about n bytes.
func msgOf(n int) *dmv1.WatchResourcesResponse {
	return &dmv1.WatchResourcesResponse{Item: &dmv1.WatchResourcesResponse_Change{Change: &dmv1.ResourceChange{
		Resource: &dmv1.Resource{Name: "example.com/r", HealthyDeviceIds: []string{strings.Repeat("d", n-itemOverhead-16)}},
	}}}
}

// TestWatchBudget drives the budget of WatchResources directly: which
// bound ends which stream, that the service's bound is never passed, and
// that every byte is given back.
func TestWatchBudget(t *testing.T) {
	const size = 10 << 10
	b := newWatchBudget(WatchLimits{Streams: 3, Bytes: 100 << 10, StreamBytes: 60 << 10})
	m := msgOf(size)
	c := cost(m)
	open := func() *watchStream {
		t.Helper()
		w, err := b.open()
		if err != nil {
			t.Fatal(err)
		}
		if err := w.admit([]*dmv1.WatchResourcesResponse{msgOf(1000)}); err != nil {
			t.Fatal(err)
		}
		return w
	}
	reader, slow, slower := open(), open(), open()
	if _, err := b.open(); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a fourth stream: %v", err)
	}
	ctx := context.Background()
	// Each takes its snapshot; the reader keeps taking what comes, and
	// the slow ones hold the message they are sending.
	for _, w := range []*watchStream{reader, slow, slower} {
		if _, err := w.next(ctx); err != nil {
			t.Fatal(err)
		}
		w.sent()
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if msg, err := slow.next(cancelled); msg != nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("next with nothing queued: %v, %v", msg, err)
	}

	read := func() {
		t.Helper()
		if _, err := reader.next(ctx); err != nil {
			t.Fatal(err)
		}
		reader.sent()
	}
	pushAll := func() {
		t.Helper()
		for _, w := range []*watchStream{reader, slower, slow} {
			w.push(m)
		}
		if st := b.stats(); st.held > b.limits.Bytes {
			t.Fatalf("held %d bytes, past %d", st.held, b.limits.Bytes)
		}
		read()
	}
	// slow is sending one message, slower none: slower has the most
	// queued.
	pushAll()
	if _, err := slow.next(ctx); err != nil {
		t.Fatal(err)
	}
	for b.stats().evicted == 0 {
		pushAll()
	}
	// Together past 100 KiB, pushing to slow, before either passed its own
	// 60 KiB: not slow but the one that held the most goes.
	if _, err := slower.next(ctx); err == nil || !strings.Contains(err.Error(), "held the most") {
		t.Fatalf("first laggard: %v", err)
	}
	if slow.evicted != nil {
		t.Fatalf("the second laggard went too: %v", slow.evicted)
	}
	// Alone, the other reaches its own bound.
	for b.stats().evicted == 1 {
		pushAll()
	}
	if _, err := slow.next(ctx); err == nil || !strings.Contains(err.Error(), "fell behind") || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("second laggard: %v", err)
	}
	// What is left: the message slow was sending.
	if st := b.stats(); st.held != c {
		t.Fatalf("held %d bytes after the evictions, want %d", st.held, c)
	}
	for _, w := range []*watchStream{reader, slow, slower} {
		w.close()
	}
	if st := b.stats(); st.held != 0 || st.streams != 0 {
		t.Fatalf("after close: %+v", st)
	}
	if reader.queue != nil {
		t.Fatal("a drained queue kept its memory")
	}
}
