package stream

import (
	"context"
)

// Serve writes a Watch stream: every snapshot item, then the synced marker,
// then live items from sub until ctx ends or the subscription is closed. It
// closes sub before returning.
//
// The error is a plain error, never a gRPC status: ctx's error, why the
// subscription was closed (ErrSlow when the subscriber fell behind, which
// wraps errdefs.ErrResourceExhausted), or a send's error. The server's
// error interceptor (pkg/rpcutil) turns it into the status the client sees:
// RESOURCE_EXHAUSTED for a slow subscriber.
func Serve[T any](ctx context.Context, snapshot []T, sub *Subscription[T], send func(T) error, synced func() error) error {
	defer sub.Close()
	for _, item := range snapshot {
		if err := send(item); err != nil {
			return err
		}
	}
	if err := synced(); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case item, ok := <-sub.C:
			if !ok {
				return sub.Err()
			}
			if err := send(item); err != nil {
				return err
			}
		}
	}
}
