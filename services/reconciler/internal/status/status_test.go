package status

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/clock"
)

func spanContext(b byte) trace.SpanContext {
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{b}, SpanID: trace.SpanID{b}})
}

// A board records what the loop tells it per generation, publishes every
// change in revision order, and drops news about a replaced generation.
func TestBoardFollowsGenerations(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	b := New(clk, stream.Limits{})
	rev, sub, err := b.Watch()
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	if sub.SnapshotLen() != 0 || rev != 0 {
		t.Fatalf("empty board: snapshot of %d at revision %d", sub.SnapshotLen(), rev)
	}

	const path = "/p/a.sock"
	b.Track(path, "g1", false)
	b.Attempting(path, "g1", spanContext(1), true)
	b.Identified(path, "g1", "example.com/a", "DevicePlugin", path, []string{"v1beta1"})
	clk.Advance(time.Second)
	b.Failed(path, "g1", errors.New("no"), 1, clk.Now().Add(time.Second))
	if got := b.FirstAttempt(path); got.SpanID() != spanContext(1).SpanID() {
		t.Fatalf("first attempt %v, want the first span", got)
	}
	b.Attempting(path, "g1", spanContext(2), false)
	if got := b.FirstAttempt(path); got.SpanID() != spanContext(1).SpanID() {
		t.Fatalf("a retry replaced the first attempt: %v", got)
	}

	// A new generation starts over as pending, keeping the plugin's identity;
	// news about the old one is dropped.
	b.Track(path, "g2", false)
	b.Registered(path, "g1")
	st, ok := b.Get(path)
	if !ok || st.Generation != "g2" || st.State != StatePending || st.Failures != 0 || st.LastError != "" ||
		st.Name != "example.com/a" || !st.LastTransition.Equal(clk.Now()) || b.FirstAttempt(path).IsValid() {
		t.Fatalf("after a new generation: %+v, first attempt %v", st, b.FirstAttempt(path))
	}
	b.Registered(path, "g2")
	if st, _ := b.Get(path); st.State != StateRegistered {
		t.Fatalf("state %v, want registered", st.State)
	}

	b.SetDeleteTrace(path, map[string]string{"traceparent": "x"})
	b.Remove(path)
	if _, ok := b.Get(path); ok || b.TakeDeleteTrace(path) != nil {
		t.Fatal("a removed socket keeps its status or its delete trace")
	}

	want := []struct {
		state   State
		removed bool
	}{
		{StatePending, false},    // Track
		{StatePending, false},    // Attempting
		{StatePending, false},    // Identified
		{StateFailed, false},     // Failed
		{StatePending, false},    // Attempting (retry)
		{StatePending, false},    // Track (g2)
		{StateRegistered, false}, // Registered (g2)
		{StateRegistered, true},  // Remove
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i, w := range want {
		c, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if c.Revision != uint64(i+1) || c.Plugin.State != w.state || c.Removed != w.removed {
			t.Fatalf("change %d = %+v, want revision %d, %v, removed %v", i, c, i+1, w.state, w.removed)
		}
	}
	cancel()
	if c, err := sub.Next(ctx); err == nil {
		t.Fatalf("unexpected change %+v (news about a replaced generation?)", c)
	}
}

// A stopped endpoint is noted on a registered socket of its generation
// only, never creates an entry, and the note goes when the endpoint is live
// again; a failed attempt's error is not taken for the note.
func TestBoardEndpointNotes(t *testing.T) {
	b := New(clock.NewFake(time.Unix(1_000_000, 0)), stream.Limits{})
	const path = "/p/a.sock"
	b.EndpointStopped("/p/unknown.sock", "g1", "stopped")
	if _, ok := b.Get("/p/unknown.sock"); ok {
		t.Fatal("a note created an entry")
	}
	b.Track(path, "g1", false)
	b.EndpointStopped(path, "g1", "stopped")
	if st, _ := b.Get(path); st.LastError != "" {
		t.Fatalf("pending socket noted: %+v", st)
	}
	b.Registered(path, "g1")
	b.EndpointStopped(path, "g0", "old stopped")
	if st, _ := b.Get(path); st.LastError != "" {
		t.Fatalf("old generation's endpoint noted: %+v", st)
	}
	b.EndpointStopped(path, "g1", "stopped")
	if st, _ := b.Get(path); st.State != StateRegistered || st.LastError != "stopped" {
		t.Fatalf("after the endpoint stopped: %+v", st)
	}
	b.EndpointLive(path, "g1")
	if st, _ := b.Get(path); st.State != StateRegistered || st.LastError != "" {
		t.Fatalf("after the endpoint came back: %+v", st)
	}
	b.Failed(path, "g1", errors.New("attempt failed"), 1, time.Time{})
	b.EndpointLive(path, "g1")
	if st, _ := b.Get(path); st.LastError != "attempt failed" {
		t.Fatalf("a live endpoint cleared a failed attempt's error: %+v", st)
	}
}
