package stream

import (
	"context"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// Serve writes a Watch stream: every snapshot item, then the synced marker,
// then live items from sub until ctx ends or the subscription is closed. It
// closes sub before returning. The returned error is a gRPC status error
// (RESOURCE_EXHAUSTED when the subscriber fell behind).
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
			return errdefs.ToGRPC(ctx.Err())
		case item, ok := <-sub.C:
			if !ok {
				return errdefs.ToGRPC(sub.Err())
			}
			if err := send(item); err != nil {
				return err
			}
		}
	}
}
