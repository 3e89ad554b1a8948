package stream

import (
	"context"
	"time"
)

// Resubscribe is the client side of a Watch stream: it calls follow until ctx
// ends, and again each time follow returns, after a delay that doubles from
// minDelay up to maxDelay and starts over after a stream that reached its
// synced marker. onEnd, when not nil, is told why each stream ended and how
// long until the next subscription.
func Resubscribe(ctx context.Context, minDelay, maxDelay time.Duration,
	follow func(ctx context.Context) (synced bool, err error), onEnd func(err error, delay time.Duration)) {
	delay := minDelay
	for {
		synced, err := follow(ctx)
		if ctx.Err() != nil {
			return
		}
		if synced {
			delay = minDelay
		}
		if onEnd != nil {
			onEnd(err, delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(delay*2, maxDelay)
	}
}
