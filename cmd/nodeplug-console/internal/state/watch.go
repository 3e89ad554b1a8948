package state

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	wv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
)

// Each watch collects the snapshot its stream opens with, replaces the
// whole map with it at the synced marker (so what went away while the
// console was not connected goes away here too), then applies each change.

func (s *State) watchSockets(ctx context.Context) error {
	st, err := wv1.NewWatcherServiceClient(s.conns.Watcher).WatchSocketEvents(ctx, &wv1.WatchSocketEventsRequest{})
	if err != nil {
		s.setStatus(Watcher, describe(err))
		return err
	}
	snap := map[string]*wv1.SocketEvent{}
	synced := false
	for {
		resp, err := st.Recv()
		if err != nil {
			s.setStatus(Watcher, describe(err))
			return err
		}
		if resp.GetSynced() != nil {
			synced = true
			s.update(func() { s.sockets, s.status[Watcher] = snap, "" })
			s.synced(Watcher, len(snap))
			continue
		}
		ev := resp.GetEvent()
		if ev == nil {
			continue
		}
		apply := func(m map[string]*wv1.SocketEvent) {
			if ev.GetType() == wv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED {
				delete(m, ev.GetPath())
			} else {
				m[ev.GetPath()] = ev
			}
		}
		if !synced {
			apply(snap)
			continue
		}
		s.update(func() { apply(s.sockets) })
	}
}

func (s *State) watchPlugins(ctx context.Context) error {
	st, err := rcv1.NewReconcilerServiceClient(s.conns.Reconciler).WatchPlugins(ctx, &rcv1.WatchPluginsRequest{})
	if err != nil {
		s.setStatus(Reconciler, describe(err))
		return err
	}
	snap := map[string]*rcv1.Plugin{}
	synced := false
	for {
		resp, err := st.Recv()
		if err != nil {
			s.setStatus(Reconciler, describe(err))
			return err
		}
		if resp.GetSynced() != nil {
			synced = true
			s.update(func() { s.plugins, s.status[Reconciler] = snap, "" })
			s.synced(Reconciler, len(snap))
			continue
		}
		ch := resp.GetChange()
		if ch == nil || ch.GetPlugin() == nil {
			continue
		}
		apply := func(m map[string]*rcv1.Plugin) {
			if ch.GetType() == rcv1.PluginChangeType_PLUGIN_CHANGE_TYPE_REMOVED {
				delete(m, ch.GetPlugin().GetSocketPath())
			} else {
				m[ch.GetPlugin().GetSocketPath()] = ch.GetPlugin()
			}
		}
		if !synced {
			apply(snap)
			continue
		}
		s.update(func() { apply(s.plugins) })
		// A DRA driver registers and goes through the reconciler, so a
		// plugin change is when the driver list may differ.
		s.refreshDRA()
	}
}

func (s *State) watchResources(ctx context.Context) error {
	st, err := dmv1.NewDeviceManagerServiceClient(s.conns.DeviceManager).WatchResources(ctx, &dmv1.WatchResourcesRequest{})
	if err != nil {
		s.setStatus(DeviceManager, describe(err))
		return err
	}
	snap := map[string]*dmv1.Resource{}
	synced := false
	for {
		resp, err := st.Recv()
		if err != nil {
			s.setStatus(DeviceManager, describe(err))
			return err
		}
		if resp.GetSynced() != nil {
			synced = true
			s.update(func() { s.resources, s.status[DeviceManager] = snap, "" })
			s.synced(DeviceManager, len(snap))
			s.refreshAllocations()
			continue
		}
		ch := resp.GetChange()
		if ch == nil || ch.GetResource() == nil {
			continue
		}
		apply := func(m map[string]*dmv1.Resource) {
			if ch.GetType() == dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_REMOVED {
				delete(m, ch.GetResource().GetName())
			} else {
				m[ch.GetResource().GetName()] = ch.GetResource()
			}
		}
		if !synced {
			apply(snap)
			continue
		}
		s.update(func() { apply(s.resources) })
		// Every Allocate and Release changes a resource's allocated
		// devices, so a change is when the allocation list may differ.
		s.refreshAllocations()
	}
}

// refreshAllocations asks for a new allocation list; requests that arrive
// while one is being fetched are folded into the next.
func (s *State) refreshAllocations() {
	select {
	case s.allocs <- struct{}{}:
	default:
	}
}

// listAllocations fetches the allocation list whenever asked, and every
// 30 s in case a change went unseen while the stream reconnected.
func (s *State) listAllocations(ctx context.Context) {
	client := dmv1.NewDeviceManagerServiceClient(s.conns.DeviceManager)
	tick := time.NewTicker(30 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.allocs:
		case <-tick.C:
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := client.ListAllocations(cctx, &dmv1.ListAllocationsRequest{})
		cancel()
		if err != nil {
			// The resource stream's next sync asks again once the
			// devicemanager is back.
			if ctx.Err() == nil {
				s.log.Debug("listing allocations", "error", err)
			}
			continue
		}
		list := slices.Clone(resp.GetAllocations())
		slices.SortStableFunc(list, func(a, b *dmv1.Allocation) int {
			return cmp.Or(strings.Compare(a.GetPodUid(), b.GetPodUid()),
				strings.Compare(a.GetContainerName(), b.GetContainerName()),
				strings.Compare(a.GetResourceName(), b.GetResourceName()))
		})
		s.update(func() { s.allocList = list })
	}
}
