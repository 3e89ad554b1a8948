package claimalloc

import (
	"strconv"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// tombstoneTTL is how long a deleted claim's UID is remembered, so that a
// version of it read or written before the deletion and noted after it does
// not bring it back. Such a late note follows its API call at once; minutes
// are plenty.
const tombstoneTTL = 10 * time.Minute

// tracker is the devices in use: per claim UID, the newest version known
// (from the claim informer, from this Allocator's own writes and from fresh
// lists; a version older than the one held is ignored) and the allocations
// decided here whose write is still in flight ("pending": in use from the
// decision until the write's outcome is noted, whatever the informer shows
// meanwhile, as the scheduler's in-flight allocations are).
type tracker struct {
	mu      sync.Mutex
	claims  map[types.UID]*tracked
	inUse   map[types.UID]*tracked // the claims with an allocation or a pending one
	deleted map[types.UID]time.Time
	pruned  time.Time // when deleted was last pruned
}

type tracked struct {
	rv      string
	results []resourcev1.DeviceRequestAllocationResult // nil: not allocated
	pending *pendingAllocation
}

// pendingAllocation is an allocation decided and not yet written; done is
// closed when its outcome is noted.
type pendingAllocation struct {
	results []resourcev1.DeviceRequestAllocationResult
	done    chan struct{}
}

func newTracker() *tracker {
	return &tracker{claims: map[types.UID]*tracked{}, inUse: map[types.UID]*tracked{}, deleted: map[types.UID]time.Time{}}
}

// newer says whether version a is newer than b. Versions that are not
// numbers (an API server that does not use etcd's) count as newer: the
// version arriving wins.
func newer(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	if errA != nil || errB != nil {
		return a != b
	}
	return x > y
}

func resultsOf(c *resourcev1.ResourceClaim) []resourcev1.DeviceRequestAllocationResult {
	if c.Status.Allocation == nil {
		return nil
	}
	if r := c.Status.Allocation.Devices.Results; r != nil {
		return r
	}
	return []resourcev1.DeviceRequestAllocationResult{} // allocated, no devices
}

// observe notes a version of a claim unless a newer one is known or the
// claim was deleted.
func (t *tracker) observe(c *resourcev1.ResourceClaim) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.observeLocked(c)
}

func (t *tracker) observeLocked(c *resourcev1.ResourceClaim) {
	if _, gone := t.deleted[c.UID]; gone || c.UID == "" {
		return
	}
	e := t.claims[c.UID]
	if e == nil {
		e = &tracked{}
		t.claims[c.UID] = e
	} else if e.rv != "" && !newer(c.ResourceVersion, e.rv) {
		return
	}
	e.rv, e.results = c.ResourceVersion, resultsOf(c)
	t.index(c.UID, e)
}

func (t *tracker) index(uid types.UID, e *tracked) {
	if e.results != nil || e.pending != nil {
		t.inUse[uid] = e
	} else {
		delete(t.inUse, uid)
	}
}

// forget notes a claim's deletion. An allocation of it still pending stays
// in use until its write fails.
func (t *tracker) forget(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.forgetLocked(uid, time.Now())
}

func (t *tracker) forgetLocked(uid types.UID, now time.Time) {
	if now.Sub(t.pruned) > tombstoneTTL/10 {
		t.pruned = now
		for u, at := range t.deleted {
			if now.Sub(at) > tombstoneTTL {
				delete(t.deleted, u)
			}
		}
	}
	t.deleted[uid] = now
	e := t.claims[uid]
	if e == nil {
		return
	}
	if e.pending == nil {
		delete(t.claims, uid)
		delete(t.inUse, uid)
		return
	}
	e.rv, e.results = "", nil
}

// reconcile takes a fresh list of every claim at resourceVersion listRV:
// its claims are observed; a claim known here, missing from the list and
// not newer than it, is gone.
func (t *tracker) reconcile(list []resourcev1.ResourceClaim, listRV string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	listed := sets.New[types.UID]()
	for i := range list {
		listed.Insert(list[i].UID)
		t.observeLocked(&list[i])
	}
	now := time.Now()
	for uid, e := range t.claims {
		if !listed.Has(uid) && e.pending == nil && e.rv != "" && !newer(e.rv, listRV) {
			t.forgetLocked(uid, now)
		}
	}
}

// pendingFor returns the channel closed when the pending allocation of the
// claim is written or dropped, nil without one.
func (t *tracker) pendingFor(uid types.UID) <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.claims[uid]; e != nil && e.pending != nil {
		return e.pending.done
	}
	return nil
}

// knowsNewer says whether a newer version of c than c is known.
func (t *tracker) knowsNewer(c *resourcev1.ResourceClaim) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.claims[c.UID]
	return e != nil && e.rv != "" && newer(e.rv, c.ResourceVersion)
}

// assume marks an allocation of the claim decided: its devices are in use
// until done is called with the claim as written (nil when the write
// failed). The caller checked with pendingFor that none was pending.
func (t *tracker) assume(uid types.UID, alloc *resourcev1.AllocationResult) (done func(written *resourcev1.ResourceClaim)) {
	p := &pendingAllocation{results: alloc.Devices.Results, done: make(chan struct{})}
	t.mu.Lock()
	e := t.claims[uid]
	if e == nil {
		e = &tracked{}
		t.claims[uid] = e
	}
	e.pending = p
	t.index(uid, e)
	t.mu.Unlock()
	var once sync.Once
	return func(written *resourcev1.ResourceClaim) {
		once.Do(func() {
			t.mu.Lock()
			defer t.mu.Unlock()
			e := t.claims[uid]
			if e != nil && e.pending == p {
				e.pending = nil
				t.index(uid, e)
			}
			if written != nil {
				t.observeLocked(written)
			}
			if _, gone := t.deleted[uid]; e != nil && e.pending == nil && (gone || e.rv == "") {
				delete(t.claims, uid)
				delete(t.inUse, uid)
			}
			close(p.done)
		})
	}
}

// state is the devices in use, as the scheduler gathers them
// (pkg/scheduler/.../dynamicresources/allocateddevices.go): devices
// allocated with admin access are not in use; with consumable capacity, a
// shared device's share and the capacity it consumes are. A claim with a
// pending allocation counts with both its known and its pending results.
func (t *tracker) state() structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.inUse {
		addResults(&state, e.results)
		if e.pending != nil {
			addResults(&state, e.pending.results)
		}
	}
	return state
}

func addResults(state *structured.AllocatedState, results []resourcev1.DeviceRequestAllocationResult) {
	for _, r := range results {
		if ptr.Deref(r.AdminAccess, false) {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if features.ConsumableCapacity && r.ShareID != nil {
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
			continue
		}
		state.AllocatedDevices.Insert(id)
	}
}
