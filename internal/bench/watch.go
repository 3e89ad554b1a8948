package bench

import (
	"context"
	"sync"
	"time"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/stream"
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

// followStream feeds f from a Watch stream until ctx ends, resubscribing
// when the stream breaks. recv returns the next item's key, value, whether it
// is a removal and whether it is the synced marker.
func followStream[T any](ctx context.Context, f *follower[T], open func(ctx context.Context) (recv func() (key string, item T, removed, synced bool, err error), err error)) {
	go stream.Resubscribe(ctx, 50*time.Millisecond, time.Second, func(ctx context.Context) (bool, error) {
		recv, err := open(ctx)
		if err != nil {
			return false, err
		}
		synced := false
		for {
			key, item, removed, isSynced, err := recv()
			if err != nil {
				return synced, err
			}
			now := time.Now()
			if isSynced {
				synced = true
				f.markSynced()
				continue
			}
			f.update(key, item, removed, now)
		}
	}, nil)
}

// followResources follows the devicemanager's WatchResources. The bench
// waits on allocatable counts and removals only, so it asks for no device
// IDs and no allocation changes: a subscriber that asks for them is sent a
// resource on each Allocate and each Release, every ID of it with the IDs,
// which for a resource of 10,000 devices is most of what an allocation
// costs the devicemanager, and without them still a stream message and a
// wake-up of the bench per call: the bench's cost, not nodeplug's.
func followResources(ctx context.Context, c dmv1.DeviceManagerServiceClient) *follower[*dmv1.Resource] {
	f := newFollower[*dmv1.Resource]()
	followStream(ctx, f, func(ctx context.Context) (func() (string, *dmv1.Resource, bool, bool, error), error) {
		s, err := c.WatchResources(ctx, &dmv1.WatchResourcesRequest{OmitDeviceIds: true, OmitAllocationChanges: true})
		if err != nil {
			return nil, err
		}
		return func() (string, *dmv1.Resource, bool, bool, error) {
			resp, err := s.Recv()
			ch := resp.GetChange()
			return ch.GetResource().GetName(), ch.GetResource(), ch.GetType() == dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_REMOVED, resp.GetSynced() != nil, err
		}, nil
	})
	return f
}

// followPlugins follows the reconciler's WatchPlugins.
func followPlugins(ctx context.Context, c rcv1.ReconcilerServiceClient) *follower[*rcv1.Plugin] {
	f := newFollower[*rcv1.Plugin]()
	followStream(ctx, f, func(ctx context.Context) (func() (string, *rcv1.Plugin, bool, bool, error), error) {
		s, err := c.WatchPlugins(ctx, &rcv1.WatchPluginsRequest{})
		if err != nil {
			return nil, err
		}
		return func() (string, *rcv1.Plugin, bool, bool, error) {
			resp, err := s.Recv()
			ch := resp.GetChange()
			return ch.GetPlugin().GetSocketPath(), ch.GetPlugin(), ch.GetType() == rcv1.PluginChangeType_PLUGIN_CHANGE_TYPE_REMOVED, resp.GetSynced() != nil, err
		}, nil
	})
	return f
}
