package stream

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestResubscribeBacksOffAndResetsAfterSync(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	var delays []time.Duration
	follow := func(context.Context) (bool, error) {
		calls++
		return calls == 3, errors.New("stream ended")
	}
	onEnd := func(err error, d time.Duration) {
		delays = append(delays, d)
		if len(delays) == 5 {
			cancel()
		}
	}
	Resubscribe(ctx, time.Millisecond, 4*time.Millisecond, follow, onEnd)
	want := []time.Duration{1, 2, 1, 2, 4}
	if len(delays) != len(want) {
		t.Fatalf("delays %v", delays)
	}
	for i := range want {
		if delays[i] != want[i]*time.Millisecond {
			t.Fatalf("delays %v, want %v ms", delays, want)
		}
	}
}
