package manager

// The allocation side of the state core: the reservations and records of
// the ledger, each change one step under the core's mutex. The flow around
// them (the choice's plugin calls, rollback, durability) is the Manager's
// (allocate.go); the choice itself is package allocator's, made from a
// snapshot the core takes under its mutex.

import (
	"fmt"
	"slices"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/endpoint"
)

// pick is the devices chosen and reserved for one resource of a request,
// with the plugin that will allocate them.
type pick struct {
	key       allocKey
	kind      allocator.ContainerKind
	ids       []string
	plugin    endpoint.Plugin
	resp      *pluginapi.ContainerAllocateResponse
	respBytes []byte
}

// pending returns the resources of req that need new devices: those the
// container holds already are answered from the record, and must ask for
// the same count. It fails when want names the pod differently from its
// first allocation.
func (c *core) pending(req *allocator.Request, want podIdentity) ([]allocator.ResourceRequest, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ledger.checkPod(req.PodUID, want); err != nil {
		return nil, err
	}
	var todo []allocator.ResourceRequest
	for _, rr := range req.Resources {
		k := allocKey{req.PodUID, req.Container, rr.Name}
		if a := c.ledger.allocs[k]; a != nil {
			if int64(len(a.ids)) != rr.Count {
				return nil, fmt.Errorf("pod %q container %q changed request for resource %q from %d to %d: %w",
					k.pod, k.container, k.resource, len(a.ids), rr.Count, errdefs.ErrFailedPrecondition)
			}
			continue
		}
		todo = append(todo, rr)
	}
	return todo, nil
}

// candidatesLocked returns the plugin that allocates devices of resource
// (its primary endpoint) and its healthy devices, sorted (the cached list,
// shared). It fails with errdefs.ErrNotFound for an unknown resource and
// errdefs.ErrFailedPrecondition when the resource has no live endpoint or
// no healthy device.
func (c *core) candidatesLocked(name string) (endpoint.Plugin, []string, error) {
	res := c.resources[name]
	if res == nil {
		return nil, nil, fmt.Errorf("cannot allocate unregistered device %s: %w", name, errdefs.ErrNotFound)
	}
	healthy := res.deviceLists().healthy
	if e := res.primary; e == nil || e.closed || len(healthy) == 0 {
		return nil, nil, fmt.Errorf("no healthy devices present; cannot allocate unhealthy devices %s: %w", name, errdefs.ErrFailedPrecondition)
	}
	return res.primary.conn, healthy, nil
}

// choose has the allocator choose devices of k's resource for rr, for a
// container of kind, from a snapshot of it: the devices of the pod's
// init containers that it may share first (ledger.reusable), then free
// ones. For a plugin without GetPreferredAllocation, or when the shared
// devices complete the choice, the choice (allocator.Lowest) is reserved
// for k and returned as ids; for one with it, nothing is reserved and
// what to offer the plugin (allocator.Offer) is returned instead, for
// reserveIfFree to take the merged answer.
func (c *core) choose(k allocKey, kind allocator.ContainerKind, rr allocator.ResourceRequest) (plugin endpoint.Plugin, ids []string, offer allocator.Offering, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	plugin, healthy, err := c.candidatesLocked(k.resource)
	if err != nil {
		return nil, nil, offer, err
	}
	snap := c.ledger.snapshot(k, kind, healthy)
	if plugin.Options().PreferredAllocation {
		if offer, err = allocator.Offer(snap, rr); err != nil || offer.Chosen == nil {
			return plugin, nil, offer, err
		}
		ids = offer.Chosen
	} else if ids, err = allocator.Lowest(snap, rr); err != nil {
		return nil, nil, offer, err
	}
	c.ledger.reserve(k, kind, ids)
	return plugin, ids, offer, nil
}

// reserveIfFree reserves ids for k, a container of kind, if every one of
// them is healthy and free now, or one it may share (ledger.reusable),
// and reports whether it did.
func (c *core) reserveIfFree(k allocKey, kind allocator.ContainerKind, ids []string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	res := c.resources[k.resource]
	if res == nil {
		return false
	}
	var reusable []string
	for _, id := range ids {
		if res.devices[id] == nil || !res.devices[id].healthy {
			return false
		}
		if !c.ledger.taken(k.resource, id) {
			continue
		}
		if reusable == nil {
			reusable = c.ledger.reusable(k, res.deviceLists().healthy)
		}
		if _, ok := slices.BinarySearch(reusable, id); !ok {
			return false
		}
	}
	c.ledger.reserve(k, kind, ids)
	return true
}

// unreserve frees the reservations of picks.
func (c *core) unreserve(picks []*pick) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range picks {
		c.ledger.unreserve(p.key, p.ids)
	}
}

// commit records the allocations of picks for a pod named want, staged for
// the store and published; the caller makes them durable. When a
// concurrent Allocate of another container fixed the pod's identity
// differently it fails, and the reservations of picks are freed.
func (c *core) commit(want podIdentity, picks []*pick, traceID string, now time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.ledger.checkPod(picks[0].key.pod, want); err != nil {
		for _, p := range picks {
			c.ledger.unreserve(p.key, p.ids)
		}
		return err
	}
	resources := make([]string, 0, len(picks))
	for _, p := range picks {
		c.ledger.add(&allocation{key: p.key, pod: want, kind: p.kind, ids: p.ids, resp: p.resp, respBytes: p.respBytes, traceID: traceID, at: now})
		c.markLocked(allocationRecord(p.key))
		resources = append(resources, p.key.resource)
	}
	c.allocationsChangedLocked(resources)
	return nil
}

// uncommit takes back the committed allocations of picks, which could not
// be saved: they are removed, and that staged. Their devices stay taken
// until the removal is durable (see freeing): the allocation may be on
// disk already, and a device free in memory is free on disk.
func (c *core) uncommit(picks []*pick) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range picks {
		c.ledger.remove(p.key)
		c.markLocked(allocationRecord(p.key))
		c.freeLaterLocked(p.key, p.ids)
	}
}

// allocated returns the container's allocations of every resource of req,
// with the current health of their devices. It fails when one of them was
// released by a concurrent Release after it was made.
func (c *core) allocated(req *allocator.Request) ([]allocator.ResourceAllocation, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]allocator.ResourceAllocation, 0, len(req.Resources))
	for _, rr := range req.Resources {
		a := c.ledger.allocs[allocKey{req.PodUID, req.Container, rr.Name}]
		if a == nil {
			return nil, fmt.Errorf("allocation of %q for pod %q container %q was released while being made: %w",
				rr.Name, req.PodUID, req.Container, errdefs.ErrFailedPrecondition)
		}
		out = append(out, c.allocationViewLocked(a))
	}
	return out, nil
}

// allocationViewLocked describes a, with the current health of its
// devices.
func (c *core) allocationViewLocked(a *allocation) allocator.ResourceAllocation {
	v := allocator.ResourceAllocation{
		Resource: a.key.resource, DeviceIDs: slices.Clone(a.ids), Response: a.resp,
		PodNamespace: a.pod.namespace, PodName: a.pod.name, Kind: a.kind,
	}
	res := c.resources[a.key.resource]
	for _, id := range a.ids {
		healthy := res != nil && res.devices[id] != nil && res.devices[id].healthy
		v.Devices = append(v.Devices, allocator.DeviceStatus{ID: id, Healthy: healthy})
	}
	return v
}

// released is what one Release removed from memory, not yet durable.
type released struct {
	pod        string
	n          int64            // devices no container holds any more, each once
	freed      map[string]int64 // n by resource
	containers []string         // the containers that held them
	allocs     []*allocation
	freeing    []*freeing
}

// release removes the allocations of the containers of pod, staged; the
// caller makes that durable. Their devices stay taken until it is (see
// freeing), so that a Release whose save fails can be taken back
// (unrelease) with no device given to another pod meanwhile.
func (c *core) release(pod string, containers []string) *released {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &released{pod: pod}
	gone := map[allocKey]bool{}
	for _, ctr := range containers {
		keys := c.ledger.podKeys(pod, ctr)
		if len(keys) > 0 {
			r.containers = append(r.containers, ctr)
		}
		for _, k := range keys {
			a := c.ledger.allocs[k]
			c.ledger.remove(k)
			c.markLocked(allocationRecord(k))
			r.allocs = append(r.allocs, a)
			r.freeing = append(r.freeing, c.freeLaterLocked(k, a.ids))
			gone[k] = true
		}
	}
	r.n, r.freed = c.freedLocked(r.allocs, gone)
	return r
}

// freedLocked counts, per resource, the devices of allocs that nothing
// holds once those of gone are removed: a device an init container shared
// with the pod's other containers counts once, and only when they all let
// it go.
func (c *core) freedLocked(allocs []*allocation, gone map[allocKey]bool) (n int64, perResource map[string]int64) {
	type dev struct{ resource, id string }
	seen := map[dev]bool{}
	perResource = map[string]int64{}
	for _, a := range allocs {
		for _, id := range a.ids {
			d := dev{a.key.resource, id}
			if seen[d] {
				continue
			}
			seen[d] = true
			if !slices.ContainsFunc(c.ledger.holders(d.resource, id), func(h holder) bool { return !gone[h.key] && c.holdingLocked(h.key) }) {
				n++
				perResource[d.resource]++
			}
		}
	}
	return n, perResource
}

// holdingLocked reports whether k holds its devices for good: it is
// recorded, or reserved by an Allocate in flight, not released (freeing).
func (c *core) holdingLocked(k allocKey) bool {
	if c.ledger.allocs[k] != nil {
		return true
	}
	return !slices.ContainsFunc(c.freeing, func(f *freeing) bool { return f.key == k })
}

// unrelease takes back r, whose save failed: its allocations are recorded
// again (and that staged, to follow the removal in the journal) and hold
// their devices as before. It reports false, and changes nothing, when
// another write made r durable meanwhile (its devices were freed).
func (c *core) unrelease(r *released) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(r.freeing) == 0 || !c.cancelFreeLocked(r.freeing) {
		return false
	}
	for _, a := range r.allocs {
		c.ledger.add(a)
		c.markLocked(allocationRecord(a.key))
	}
	return true
}

// podContainers returns the containers of pod that hold allocations,
// sorted.
func (c *core) podContainers(pod string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, k := range c.ledger.podKeys(pod, "") {
		out = append(out, k.container)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// allocationsChangedLocked publishes again the views of resources (free
// and allocated devices), whose allocations changed, when a subscriber
// takes such changes. Nothing else changed: the device metrics stay, and
// the resources' records are not staged (the allocations' are).
func (c *core) allocationsChangedLocked(resources []string) {
	if !c.hub.Wanted(Change{AllocationsOnly: true}) {
		return
	}
	for _, name := range resources {
		if res := c.resources[name]; res != nil {
			c.publishLocked(Change{AllocationsOnly: true, Resource: c.viewLocked(res)})
		}
	}
}

// known reports whether resource is registered (has a device set).
func (c *core) known(resource string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.resources[resource] != nil
}

// ListAllocations returns every allocation, or those of one pod, sorted by
// pod, container and resource. The plugin responses are shared: callers
// must not modify them.
func (c *core) ListAllocations(pod string) []allocator.Allocation {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ledger.list(pod)
}
