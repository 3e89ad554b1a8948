package stream

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

func TestSlowSubscriberIsDroppedOthersContinue(t *testing.T) {
	h := NewHub[int](4)
	slow := h.Subscribe()
	fast := h.Subscribe()
	got := make(chan int, 100)
	go func() {
		for v := range fast.C {
			got <- v
		}
	}()
	for i := 0; i < 20; i++ {
		h.Publish(i)
		// The fast reader drains; wait until it has each item so only the
		// slow one overflows.
		select {
		case v := <-got:
			if v != i {
				t.Fatalf("fast got %d, want %d", v, i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("fast subscriber did not receive %d", i)
		}
	}
	for range slow.C {
	}
	if !errors.Is(slow.Err(), ErrSlow) {
		t.Fatalf("slow.Err() = %v, want ErrSlow", slow.Err())
	}
	if h.Len() != 1 {
		t.Fatalf("hub has %d subscribers, want 1", h.Len())
	}
	fast.Close()
	fast.Close()
	if fast.Err() != nil || h.Len() != 0 {
		t.Fatalf("after Close: err %v, subscribers %d", fast.Err(), h.Len())
	}
}

func TestServeOrderAndOverflowStatus(t *testing.T) {
	h := NewHub[string](2)
	sub := h.Subscribe()
	h.Publish("live1")
	var out []string
	send := func(s string) error { out = append(out, s); return nil }
	synced := func() error { out = append(out, "synced"); return nil }
	h.Publish("live2")
	h.Publish("overflow") // buffer of 2 is full: the subscriber is dropped
	err := Serve(context.Background(), []string{"snap1", "snap2"}, sub, send, synced)
	want := []string{"snap1", "snap2", "synced", "live1", "live2"}
	if len(out) != len(want) {
		t.Fatalf("sent %v, want %v", out, want)
	}
	for i := range want {
		if out[i] != want[i] {
			t.Fatalf("sent %v, want %v", out, want)
		}
	}
	if !errors.Is(err, ErrSlow) || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("Serve error = %v, want ErrSlow", err)
	}
	if _, ok := status.FromError(err); ok {
		t.Fatalf("Serve error %v is a gRPC status; the interceptor maps errors", err)
	}
}

func TestServeEndsWithContext(t *testing.T) {
	h := NewHub[int](1)
	sub := h.Subscribe()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Serve(ctx, nil, sub, func(int) error { return nil }, func() error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve = %v, want context.Canceled", err)
	}
	if h.Len() != 0 {
		t.Fatal("subscription not removed")
	}
}
