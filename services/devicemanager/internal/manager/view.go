package manager

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/allocator"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/endpoint"
)

// resource is one resource's device set and endpoints, guarded by
// Manager.mu.
type resource struct {
	name    string
	devices map[string]*device
	// lists caches the device IDs, sorted and split by health; nil after
	// the devices or their health changed (devicesChanged).
	lists     *deviceLists
	endpoints map[string]*entry // by endpoint path
	primary   *entry
	// stoppedAt is set while no endpoint is live: the grace period runs.
	stoppedAt time.Time
}

// deviceLists are a resource's device IDs in sorted order: all of them,
// the healthy ones and the unhealthy ones. They are kept from one change of
// the devices to the next, so that an allocation, which changes none of
// them, costs nothing per device: not in its choice of devices, not in the
// view it publishes. The slices are shared (and clipped, so an append
// copies): nobody may change them.
type deviceLists struct {
	all, healthy, unhealthy []string
}

// deviceLists returns the cached lists of r, building them if the devices
// changed since.
func (r *resource) deviceLists() *deviceLists {
	if r.lists == nil {
		l := &deviceLists{all: slices.Sorted(maps.Keys(r.devices))}
		for _, id := range l.all {
			if r.devices[id].healthy {
				l.healthy = append(l.healthy, id)
			} else {
				l.unhealthy = append(l.unhealthy, id)
			}
		}
		l.all, l.healthy, l.unhealthy = slices.Clip(l.all), slices.Clip(l.healthy), slices.Clip(l.unhealthy)
		r.lists = l
	}
	return r.lists
}

// devicesChanged drops the cached lists: call it after changing the device
// set or any device's health.
func (r *resource) devicesChanged() { r.lists = nil }

// sortedIDs returns the device IDs in sorted order. The slice is shared:
// callers must not change it.
func (r *resource) sortedIDs() []string { return r.deviceLists().all }

func (r *resource) healthyCount() int { return len(r.deviceLists().healthy) }

type device struct {
	id      string
	healthy bool
	numa    []int64
}

// entry is one registered endpoint of a resource, guarded by Manager.mu.
type entry struct {
	resource string
	path     string // as registered (absolute)
	dialPath string // resolved inside the allowed directories
	// id is the socket's identity when it was checked; every dial of conn
	// connects that socket only. Zero for an endpoint restored from the
	// store and not redialled.
	id         unixsock.Identity
	socketPath string
	generation string
	regPath    RegistrationPath
	versions   []string
	opts       endpoint.Options
	state      EndpointState
	seq        uint64
	registered time.Time
	stopped    time.Time
	// conn is nil for an endpoint restored from the store and not
	// redialled.
	conn *endpoint.Conn
	// closed: its end has been handled (replaced, deregistered or stopped);
	// its stream no longer changes anything.
	closed bool
}

// changedLocked records a change of res: it is staged for the store, and
// published.
func (m *Manager) changedLocked(res *resource) {
	m.dirty[res.name] = true
	m.publishViewLocked(res)
}

// publishViewLocked updates the metrics of res and publishes its view.
func (m *Manager) publishViewLocked(res *resource) {
	v := m.viewLocked(res)
	m.metrics.devices.WithLabelValues(res.name, "healthy").Set(float64(len(v.Healthy)))
	m.metrics.devices.WithLabelValues(res.name, "unhealthy").Set(float64(len(v.Unhealthy)))
	m.publishLocked(Change{Resource: v})
}

// publishLocked publishes c at the next revision.
func (m *Manager) publishLocked(c Change) {
	m.revision++
	c.Revision = m.revision
	m.hub.Publish(c)
}

func (m *Manager) viewLocked(res *resource) ResourceInfo {
	v := ResourceInfo{Name: res.name, Capacity: int64(len(res.devices))}
	lists := res.deviceLists()
	v.Healthy, v.Unhealthy = lists.healthy, lists.unhealthy
	v.Allocatable = int64(len(v.Healthy))
	// Free counts from the allocations, not the devices: its cost follows
	// the allocations of this resource, whatever the number of devices.
	taken := m.alloc.Taken(res.name)
	v.Free = v.Allocatable
	for _, id := range taken {
		if d := res.devices[id]; d != nil && d.healthy {
			v.Free--
		}
	}
	v.Allocated = taken
	for _, e := range res.sortedEndpoints() {
		v.Endpoints = append(v.Endpoints, EndpointInfo{
			Endpoint: e.path, SocketPath: e.socketPath, Generation: e.generation, Path: e.regPath,
			State: e.state, Versions: slices.Clone(e.versions), Primary: e == res.primary,
			PreStartRequired: e.opts.PreStartRequired, PreferredAllocation: e.opts.PreferredAllocation,
			Registered: e.registered, Stopped: e.stopped,
		})
	}
	if !res.stoppedAt.IsZero() {
		v.GraceDeadline = res.stoppedAt.Add(m.grace)
	}
	return v
}

// sortedEndpoints returns the endpoints in registration order.
func (r *resource) sortedEndpoints() []*entry {
	return slices.SortedFunc(maps.Values(r.endpoints), func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
}

// ListResources returns every resource, sorted by name.
func (m *Manager) ListResources() []ResourceInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ResourceInfo
	for _, name := range slices.Sorted(maps.Keys(m.resources)) {
		out = append(out, m.viewLocked(m.resources[name]))
	}
	return out
}

// Watch returns a subscription that delivers every resource (one Change
// each, sorted by name, at the revision returned), then every later change,
// consistently: no change falls between them; opts leave some out. The
// caller closes the subscription. It fails with an error wrapping
// stream.ErrTooManySubscribers (and errdefs.ErrResourceExhausted) when
// Config.WatchLimits leave no room; a subscriber past them later ends with
// stream.ErrSlow or stream.ErrOverBudget.
func (m *Manager) Watch(opts WatchOptions) (uint64, *stream.Subscription[Change], error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	snapshot := make([]Change, 0, len(m.resources))
	for _, name := range slices.Sorted(maps.Keys(m.resources)) {
		c := Change{Resource: m.viewLocked(m.resources[name]), Revision: m.revision}
		if opts.OmitDeviceIDs {
			c = c.WithoutDeviceIDs()
		}
		snapshot = append(snapshot, c)
	}
	var keep func(Change) bool
	if opts.OmitAllocationChanges {
		keep = func(c Change) bool { return !c.AllocationsOnly }
	}
	sub, err := m.hub.JoinWhere(snapshot, keep)
	if err != nil {
		return 0, nil, fmt.Errorf("watch the resources: %w", err)
	}
	return m.revision, sub, nil
}

// WatchStats returns how many Watch subscribers are open, the bytes of
// changes they hold and how many were closed for a bound.
func (m *Manager) WatchStats() stream.Stats { return m.hub.Stats() }

// The manager is the allocator's view of the device sets.
var _ allocator.Resources = (*Manager)(nil)

// Candidates implements allocator.Resources: the primary endpoint of
// resource and its healthy devices (the cached list, shared).
func (m *Manager) Candidates(name string) (endpoint.Plugin, []string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	res := m.resources[name]
	if res == nil {
		return nil, nil, fmt.Errorf("cannot allocate unregistered device %s: %w", name, errdefs.ErrNotFound)
	}
	healthy := res.deviceLists().healthy
	if e := res.primary; e == nil || e.closed || len(healthy) == 0 {
		return nil, nil, fmt.Errorf("no healthy devices present; cannot allocate unhealthy devices %s: %w", name, errdefs.ErrFailedPrecondition)
	}
	return res.primary.conn, healthy, nil
}

// Health implements allocator.Resources.
func (m *Manager) Health(name string, ids []string) []bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	res := m.resources[name]
	out := make([]bool, len(ids))
	for i, id := range ids {
		out[i] = res != nil && res.devices[id] != nil && res.devices[id].healthy
	}
	return out
}

// Known implements allocator.Resources.
func (m *Manager) Known(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.resources[name] != nil
}

// AllocationsChanged implements allocator.Resources: the views of those
// resources (free and allocated devices) are published again, when a
// subscriber takes such changes. Nothing else changed: the device metrics
// stay, and nothing is staged for the store (the allocator saves its own).
func (m *Manager) AllocationsChanged(names []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.hub.Wanted(Change{AllocationsOnly: true}) {
		return
	}
	for _, name := range names {
		if res := m.resources[name]; res != nil {
			m.publishLocked(Change{AllocationsOnly: true, Resource: m.viewLocked(res)})
		}
	}
}

// Allocate gives devices to one container (see allocator.Allocator).
func (m *Manager) Allocate(ctx context.Context, req *allocator.Request) ([]allocator.ResourceAllocation, error) {
	return m.alloc.Allocate(ctx, req)
}

// Release frees the devices of a pod, or of one of its containers (see
// allocator.Allocator).
func (m *Manager) Release(ctx context.Context, pod, container string) (int64, error) {
	return m.alloc.Release(ctx, pod, container)
}

// ListAllocations returns every allocation, or those of one pod (see
// allocator.Allocator).
func (m *Manager) ListAllocations(pod string) []allocator.Allocation {
	return m.alloc.List(pod)
}
