package manager

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/services/devicemanager/internal/endpoint"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/store"
)

// persist makes every change so far durable: it stages the resources and
// allocations that changed since the last call, appends them to the store
// in the order they were staged, and waits for the store outside that
// order, so that concurrent callers share one sync (the store's group
// commit). A caller whose change was staged by another one appends
// nothing and waits for that one's sync.
func (m *Manager) persist() error {
	m.saveMu.Lock()
	var b store.Batch
	m.mu.Lock()
	for name := range m.dirty {
		if res := m.resources[name]; res != nil {
			b.Resources = append(b.Resources, m.recordLocked(res))
		} else {
			b.RemovedResources = append(b.RemovedResources, name)
		}
	}
	clear(m.dirty)
	m.mu.Unlock()
	m.alloc.Stage(&b)
	t, err := m.store.Append(b)
	m.saveMu.Unlock()
	if err != nil {
		return err
	}
	return m.store.Wait(t)
}

// recordLocked is the stored record of res.
func (m *Manager) recordLocked(res *resource) store.Resource {
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

// Restore loads the saved state and redials the endpoints it records.
// Endpoints still serving are live again at once, with their recorded
// generation, so a later registration of the same generation is a no-op.
// Resources whose endpoints do not answer are kept with every device
// unhealthy until a plugin registers or the grace period ends. Saved state
// that cannot be trusted is moved aside, logged as an error, and the
// manager starts empty. Call Restore once, before serving (Open does).
func (m *Manager) Restore(ctx context.Context) error {
	d, err := m.store.Load()
	if !store.OnlyCorruptions(err) {
		return err
	}
	for _, c := range store.Corruptions(err) {
		msg := "CHECKPOINT UNUSABLE: moved aside; starting with no allocations and no endpoints"
		if d != nil {
			msg = "CHECKPOINT UNUSABLE: moved aside; starting with what preceded the damage"
		}
		m.log.Error(msg, "path", c.Path, "moved_to", c.MovedTo, "also_moved", c.Also, "error", c.Err)
	}
	if d == nil {
		if err == nil {
			m.log.Info("no checkpoint; starting empty", "path", m.store.Location())
		}
		return nil
	}
	now := time.Now()
	var restored []*entry
	m.mu.Lock()
	for _, r := range d.Resources {
		res := &resource{name: r.Name, devices: map[string]*device{}, endpoints: map[string]*entry{}, stoppedAt: now}
		for _, dv := range r.Devices {
			res.devices[dv.ID] = &device{id: dv.ID, healthy: dv.Healthy, numa: dv.NUMANodes}
		}
		for _, se := range r.Endpoints {
			m.seq++
			e := &entry{
				resource: r.Name, path: se.Endpoint, socketPath: se.SocketPath, generation: se.Generation,
				regPath: RegistrationPath(se.RegistrationPath), versions: se.Versions,
				opts:  endpoint.Options{PreStartRequired: se.PreStartRequired, PreferredAllocation: se.Preferred},
				state: StateStopped, seq: m.seq, registered: se.Registered, stopped: now, closed: true,
			}
			res.endpoints[e.path] = e
			if se.Primary || res.primary == nil {
				res.primary = e
			}
			restored = append(restored, e)
		}
		m.resources[r.Name] = res
	}
	m.mu.Unlock()
	m.alloc.Restore(d.Allocations)
	m.log.Info("checkpoint restored", "path", m.store.Location(), "resources", len(d.Resources), "endpoints", len(restored), "allocations", len(d.Allocations))

	var wg sync.WaitGroup
	for _, old := range restored {
		wg.Go(func() { m.redial(ctx, old) })
	}
	wg.Wait()

	m.mu.Lock()
	for _, res := range m.resources {
		if res.primary == nil || res.primary.closed {
			for _, dv := range res.devices {
				dv.healthy = false
			}
			res.devicesChanged()
			res.stoppedAt = now
		}
		m.changedLocked(res)
	}
	m.mu.Unlock()
	m.poke()
	return m.persist()
}

// redial reconnects an endpoint recorded in the saved state.
func (m *Manager) redial(ctx context.Context, old *entry) {
	ctx, span := tracer.Start(ctx, "redial "+old.resource, trace.WithNewRoot())
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, redialTimeout)
	defer cancel()
	dialPath, id, err := m.confiner.Identify(old.path)
	if err != nil {
		m.log.InfoContext(ctx, "recorded endpoint not redialled", "resource", old.resource, "endpoint", old.path, "error", err)
		return
	}
	e := &entry{
		resource: old.resource, path: old.path, dialPath: dialPath, id: id, socketPath: old.socketPath,
		generation: old.generation, regPath: old.regPath, versions: old.versions, registered: old.registered,
	}
	unlock := m.regLocks.Lock(e.path)
	defer unlock()
	if err := m.connect(ctx, e); err != nil {
		m.log.InfoContext(ctx, "recorded endpoint does not answer; waiting for its plugin to register again",
			"resource", old.resource, "endpoint", old.path, "dial_path", dialPath, "error", err)
		return
	}
	if _, err := m.install(e); err != nil {
		m.log.WarnContext(ctx, "recorded endpoint not restored", "resource", e.resource, "endpoint", e.path, "dial_path", e.dialPath, "error", err)
		return
	}
	m.log.InfoContext(ctx, "recorded endpoint live again", "resource", e.resource, "endpoint", e.path, "dial_path", e.dialPath, "generation", e.generation)
}
