package manager

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/endpoint"
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
func (c *core) changedLocked(res *resource) {
	c.markLocked(resourceRecord(res.name))
	c.publishViewLocked(res)
}

// publishViewLocked updates the metrics of res and publishes its view.
func (c *core) publishViewLocked(res *resource) {
	v := c.viewLocked(res)
	c.metrics.devices.WithLabelValues(res.name, "healthy").Set(float64(len(v.Healthy)))
	c.metrics.devices.WithLabelValues(res.name, "unhealthy").Set(float64(len(v.Unhealthy)))
	c.publishLocked(Change{Resource: v})
}

// publishLocked publishes c at the next revision.
func (c *core) publishLocked(ch Change) {
	c.revision++
	ch.Revision = c.revision
	c.hub.Publish(ch)
}

func (c *core) viewLocked(res *resource) ResourceInfo {
	v := ResourceInfo{Name: res.name, Capacity: int64(len(res.devices))}
	lists := res.deviceLists()
	v.Healthy, v.Unhealthy = lists.healthy, lists.unhealthy
	v.Allocatable = int64(len(v.Healthy))
	// Free counts from the allocations, not the devices: its cost follows
	// the allocations of this resource, whatever the number of devices.
	taken := c.ledger.takenIDs(res.name)
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
		v.GraceDeadline = res.stoppedAt.Add(c.grace)
	}
	return v
}

// sortedEndpoints returns the endpoints in registration order.
func (r *resource) sortedEndpoints() []*entry {
	return slices.SortedFunc(maps.Values(r.endpoints), func(a, b *entry) int { return cmp.Compare(a.seq, b.seq) })
}

// ListResources returns every resource, sorted by name.
func (c *core) ListResources() []ResourceInfo {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ResourceInfo
	for _, name := range slices.Sorted(maps.Keys(c.resources)) {
		out = append(out, c.viewLocked(c.resources[name]))
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
func (c *core) Watch(opts WatchOptions) (uint64, *stream.Subscription[Change], error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	snapshot := make([]Change, 0, len(c.resources))
	for _, name := range slices.Sorted(maps.Keys(c.resources)) {
		ch := Change{Resource: c.viewLocked(c.resources[name]), Revision: c.revision}
		if opts.OmitDeviceIDs {
			ch = ch.WithoutDeviceIDs()
		}
		snapshot = append(snapshot, ch)
	}
	var keep func(Change) bool
	if opts.OmitAllocationChanges {
		keep = func(ch Change) bool { return !ch.AllocationsOnly }
	}
	sub, err := c.hub.JoinWhere(snapshot, keep)
	if err != nil {
		return 0, nil, fmt.Errorf("watch the resources: %w", err)
	}
	return c.revision, sub, nil
}

// WatchStats returns how many Watch subscribers are open, the bytes of
// changes they hold and how many were closed for a bound.
func (c *core) WatchStats() stream.Stats { return c.hub.Stats() }
