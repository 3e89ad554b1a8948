package stream

import (
	"context"
	"errors"
)

// Serve writes a Watch stream: the subscription's snapshot items, then the
// synced marker, then live items, until ctx ends or the subscription ends.
// It closes sub before returning, which gives back what it held.
//
// The error is a plain error, never a gRPC status: ctx's error, why the
// subscription ended (an error wrapping ErrSlow or ErrOverBudget when the
// subscriber was closed for a bound, both wrapping
// errdefs.ErrResourceExhausted), or a send's error; nil when the hub closed
// cleanly. The server's error interceptor (pkg/rpcutil) turns it into the
// status the client sees: RESOURCE_EXHAUSTED for a bound.
func Serve[T any](ctx context.Context, sub *Subscription[T], send func(T) error, synced func() error) error {
	defer sub.Close()
	for i := 0; ; i++ {
		if i == sub.SnapshotLen() {
			if err := synced(); err != nil {
				return err
			}
		}
		item, err := sub.Next(ctx)
		if errors.Is(err, ErrClosed) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := send(item); err != nil {
			return err
		}
	}
}
