package bench

import (
	"context"
	"sync"
	"time"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
)

// waiter fires once when pred holds for the item of a key.
type waiter[T any] struct {
	pred func(T) bool
	ch   chan time.Time
}

// follower keeps the latest item per key from a Watch stream and wakes
// waiters with the time the matching item arrived.
type follower[T any] struct {
	mu      sync.Mutex
	latest  map[string]T
	removed map[string]bool
	waiters map[string][]waiter[T]
	synced  chan struct{}
	once    sync.Once
}

func newFollower[T any]() *follower[T] {
	return &follower[T]{latest: map[string]T{}, removed: map[string]bool{}, waiters: map[string][]waiter[T]{}, synced: make(chan struct{})}
}

func (f *follower[T]) update(key string, item T, removed bool, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.latest[key] = item
	f.removed[key] = removed
	ws := f.waiters[key]
	kept := ws[:0]
	for _, w := range ws {
		if (w.pred == nil && removed) || (w.pred != nil && !removed && w.pred(item)) {
			w.ch <- at
			continue
		}
		kept = append(kept, w)
	}
	f.waiters[key] = kept
}

// wait returns a channel that receives the arrival time of the first item of
// key for which pred holds (pred nil: the removal of key). An item already
// there that matches fires at once.
func (f *follower[T]) wait(key string, pred func(T) bool) <-chan time.Time {
	ch := make(chan time.Time, 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if item, ok := f.latest[key]; ok {
		if pred != nil && !f.removed[key] && pred(item) || pred == nil && f.removed[key] {
			ch <- time.Now()
			return ch
		}
	}
	f.waiters[key] = append(f.waiters[key], waiter[T]{pred: pred, ch: ch})
	return ch
}

func (f *follower[T]) markSynced() { f.once.Do(func() { close(f.synced) }) }

// followResources follows the devicemanager's WatchResources until ctx ends,
// resubscribing when the stream breaks.
func followResources(ctx context.Context, c dmv1.DeviceManagerServiceClient) *follower[*dmv1.Resource] {
	f := newFollower[*dmv1.Resource]()
	go func() {
		for ctx.Err() == nil {
			s, err := c.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
			if err == nil {
				for {
					resp, err := s.Recv()
					if err != nil {
						break
					}
					now := time.Now()
					if resp.GetSynced() != nil {
						f.markSynced()
						continue
					}
					ch := resp.GetChange()
					f.update(ch.GetResource().GetName(), ch.GetResource(), ch.GetType() == dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_REMOVED, now)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return f
}

// followPlugins follows the reconciler's WatchPlugins until ctx ends.
func followPlugins(ctx context.Context, c rcv1.ReconcilerServiceClient) *follower[*rcv1.Plugin] {
	f := newFollower[*rcv1.Plugin]()
	go func() {
		for ctx.Err() == nil {
			s, err := c.WatchPlugins(ctx, &rcv1.WatchPluginsRequest{})
			if err == nil {
				for {
					resp, err := s.Recv()
					if err != nil {
						break
					}
					now := time.Now()
					if resp.GetSynced() != nil {
						f.markSynced()
						continue
					}
					ch := resp.GetChange()
					f.update(ch.GetPlugin().GetSocketPath(), ch.GetPlugin(), ch.GetType() == rcv1.PluginChangeType_PLUGIN_CHANGE_TYPE_REMOVED, now)
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return f
}
