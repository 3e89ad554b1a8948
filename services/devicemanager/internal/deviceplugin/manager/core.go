package manager

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nodeplug/nodeplug/pkg/memory"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// core is the devicemanager's state and its one owner: the resources (their
// device sets, endpoints and grace periods, and the index of live
// endpoints), the allocations and the reservations of the Allocate calls in
// flight (ledger), the Watch hub that publishes every change, and the
// staging of all of it to the store (persist). Everything that changes the
// state is a method of core, taken under its mutex; the endpoint life
// (manager.go: dial, streams, redial) and the allocation flow
// (allocate.go: the choice, made by package allocator from a snapshot the
// core gives it, and the plugin calls) are its clients, and never hold its
// mutex across a call out.
//
// Locks are taken in this order only: an endpoint path's or a container's
// lock (the clients'), saveMu, mu.
type core struct {
	log     *slog.Logger
	grace   time.Duration
	store   store.Store
	hub     *stream.Hub[Change]
	metrics *metrics

	saveMu sync.Mutex // orders staging and appending to the store

	mu        sync.Mutex
	closing   bool
	resources map[string]*resource
	// live indexes the endpoints not closed by their path and by the
	// socket they resolve to, so that a registration's identity check
	// (conflictLocked) looks at those alone, not at every endpoint: a
	// burst of N registrations costs O(N), not O(N²).
	live   map[string]map[*entry]struct{}
	ledger ledger
	// staged holds the records changed since they were last staged for
	// the store.
	staged map[journalKey]struct{}
	// stages counts the stagings for the store (persist); freeing are
	// the devices of removed allocations, taken until the removal is
	// durable (core_unsaved.go).
	stages   uint64
	freeing  []*freeing
	seq      uint64
	revision uint64
	burst    *memory.Burst // endpoint changes since memory was last given back
	wake     chan struct{} // a grace period started, or a burst: Run recomputes its timer
	flush    chan struct{} // asks Run to write the state soon

	// wg counts the endpoints' stream goroutines and connection closes.
	// Add is called under mu while not closing, so that Close's Wait,
	// which follows closing, sees every one.
	wg sync.WaitGroup
}

func newCore(cfg Config) *core {
	return &core{
		log:       cfg.Log,
		grace:     cfg.GracePeriod,
		store:     cfg.Store,
		hub:       stream.NewBoundedHub(cfg.WatchLimits, Change.size),
		metrics:   newMetrics(cfg.Registerer),
		resources: map[string]*resource{},
		live:      map[string]map[*entry]struct{}{},
		ledger:    newLedger(),
		staged:    map[journalKey]struct{}{},
		burst:     memory.NewBurst(cfg.GiveBack),
		wake:      make(chan struct{}, 1),
		flush:     make(chan struct{}, 1),
	}
}

// recordKind is the kind of a record of the store's journal that the core
// stages. A new kind of state (a prepared DRA claim, say) adds a kind
// here, its key fields to journalKey, and its case to stageLocked: the
// core stays its one owner, and it is staged and made durable with the
// rest, in the same group commits.
type recordKind uint8

const (
	// recordResource: a resource's device set and endpoints
	// (store.Resource), or its removal.
	recordResource recordKind = iota + 1
	// recordAllocation: one container's allocation of one resource
	// (store.Allocation), or its removal.
	recordAllocation
)

// journalKey names one record the core stages: its kind and the key of
// that kind (a resource's name; an allocation's pod, container and
// resource).
type journalKey struct {
	kind           recordKind
	resource       string
	pod, container string
}

func resourceRecord(name string) journalKey {
	return journalKey{kind: recordResource, resource: name}
}

func allocationRecord(k allocKey) journalKey {
	return journalKey{kind: recordAllocation, resource: k.resource, pod: k.pod, container: k.container}
}

// markLocked records that k changed: the next persist stages it.
func (c *core) markLocked(k journalKey) { c.staged[k] = struct{}{} }

// stageLocked moves into b every record changed since it was last staged,
// as it is now.
func (c *core) stageLocked(b *store.Batch) {
	for k := range c.staged {
		switch k.kind {
		case recordResource:
			if res := c.resources[k.resource]; res != nil {
				b.Resources = append(b.Resources, c.recordLocked(res))
			} else {
				b.RemovedResources = append(b.RemovedResources, k.resource)
			}
		case recordAllocation:
			c.ledger.stage(b, allocKey{pod: k.pod, container: k.container, resource: k.resource})
		default:
			panic(fmt.Sprintf("devicemanager: staging a record of unknown kind %d", k.kind))
		}
	}
	clear(c.staged)
}

// persist makes every change so far durable: it stages the resources and
// allocations that changed since the last call, appends them to the store
// in the order they were staged, and waits for the store outside that
// order, so that concurrent callers share one sync (the store's group
// commit). A caller whose change was staged by another one appends
// nothing and waits for that one's sync.
//
// Once the write succeeds, the devices whose removal it holds are free
// (settle). A batch the store refuses to take is staged again, so the next
// write holds it.
func (c *core) persist() error {
	c.saveMu.Lock()
	var b store.Batch
	c.mu.Lock()
	c.stageLocked(&b)
	c.stages++
	stage := c.stages
	c.mu.Unlock()
	t, err := c.store.Append(b)
	if err != nil {
		c.mu.Lock()
		c.restageLocked(&b)
		c.mu.Unlock()
	}
	c.saveMu.Unlock()
	if err == nil {
		err = c.store.Wait(t)
	}
	if err != nil {
		return err
	}
	c.settle(stage)
	return nil
}

// restageLocked marks again every record of b, which the store did not
// take.
func (c *core) restageLocked(b *store.Batch) {
	for _, r := range b.Resources {
		c.markLocked(resourceRecord(r.Name))
	}
	for _, name := range b.RemovedResources {
		c.markLocked(resourceRecord(name))
	}
	for _, a := range b.Allocations {
		c.markLocked(allocationRecord(allocKey{a.PodUID, a.ContainerName, a.ResourceName}))
	}
	for _, k := range b.RemovedAllocations {
		c.markLocked(allocationRecord(allocKey{k.PodUID, k.ContainerName, k.ResourceName}))
	}
}

// recordLocked is the stored record of res.
func (c *core) recordLocked(res *resource) store.Resource {
	r := store.Resource{Name: res.name, Devices: make([]store.Device, 0, len(res.devices)), Endpoints: []store.Endpoint{}}
	for _, id := range res.sortedIDs() {
		dev := res.devices[id]
		r.Devices = append(r.Devices, store.Device{ID: id, Healthy: dev.healthy, NUMANodes: dev.numa})
	}
	for _, e := range res.sortedEndpoints() {
		r.Endpoints = append(r.Endpoints, store.Endpoint{
			Endpoint: e.path, SocketPath: e.socketPath, Generation: e.generation,
			RegistrationPath: string(e.regPath), Versions: e.versions,
			PreStartRequired: e.opts.PreStartRequired, Preferred: e.opts.PreferredAllocation,
			Registered: e.registered, Primary: e == res.primary,
		})
	}
	return r
}

// persistSoon asks Run to write the state. Device updates, stopped
// endpoints, deregistrations and expiries use it, so they never wait for
// the disk: writes are gathered, and a registration, an Allocate or a
// Release (which write before they return) or Close writes everything
// pending too.
func (c *core) persistSoon() {
	select {
	case c.flush <- struct{}{}:
	default:
	}
}

func (c *core) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// changesLocked records n endpoint arrivals, departures or resource
// removals at now for the give-back (see GiveBack), and wakes Run when
// they make a burst.
func (c *core) changesLocked(now time.Time, n int) {
	if c.burst.Changed(now, n) {
		c.poke()
	}
}

// compact is the core's part of a memory give-back (memory.Giver's hook):
// see compactLocked.
func (c *core) compact() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.compactLocked()
}

// compactLocked rebuilds the core's maps, sized to what they hold now:
// a Go map never shrinks, so after a burst of departures they would keep
// the room of every plugin that left.
func (c *core) compactLocked() {
	c.resources = rebuilt(c.resources)
	c.live = rebuilt(c.live)
	c.staged = rebuilt(c.staged)
}

func rebuilt[K comparable, V any](in map[K]V) map[K]V {
	out := make(map[K]V, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

// expireLocked removes resources whose grace period ended and returns the
// next deadline.
func (c *core) expireLocked(now time.Time) (next time.Time, removed bool) {
	for name, res := range c.resources {
		if res.stoppedAt.IsZero() {
			continue
		}
		deadline := res.stoppedAt.Add(c.grace)
		if !now.Before(deadline) {
			c.log.Info("resource removed: grace period ended with no live endpoint", "resource", name)
			delete(c.resources, name)
			c.markLocked(resourceRecord(name))
			c.metrics.forget(name)
			c.publishLocked(Change{Removed: true, Resource: c.viewLocked(res)})
			c.changesLocked(now, 1)
			removed = true
			continue
		}
		if next.IsZero() || deadline.Before(next) {
			next = deadline
		}
	}
	return next, removed
}

// tick is Run's periodic step at now: it removes the resources whose grace
// period ended (and asks for their write), and says whether a burst of
// endpoint changes is due for the give-back (give, with its changes; Run
// gives it back, compact its hook). next is the next deadline of either.
func (c *core) tick(now time.Time) (next time.Time, changes int, give bool) {
	c.mu.Lock()
	next, removed := c.expireLocked(now)
	changes, give = c.burst.Take(now)
	if at, ok := c.burst.Due(); ok && (next.IsZero() || at.Before(next)) {
		next = at
	}
	c.mu.Unlock()
	if removed {
		c.persistSoon()
	}
	return next, changes, give
}
