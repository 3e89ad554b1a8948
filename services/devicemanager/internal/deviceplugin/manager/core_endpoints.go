package manager

// The endpoint side of the state core: the transitions of an endpoint's
// life (admitted, installed, updated, stopped, deregistered), each one
// step under the core's mutex. The I/O around them (dial, the streams,
// redial) is the Manager's (manager.go, persist.go).

import (
	"errors"
	"time"

	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/endpoint"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// admit checks a registration of r at the socket id against the live
// endpoints: it fails once the core closes, and with an
// *EndpointConflictError when the endpoint is live under another resource.
// It returns the live endpoint that r names again with the same generation,
// if any: that registration has nothing left to do.
func (c *core) admit(r Registration, id unixsock.Identity) (*entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return nil, errShuttingDown
	}
	if err := c.conflictLocked(r.Resource, r.Endpoint, id); err != nil {
		return nil, err
	}
	if res := c.resources[r.Resource]; res != nil {
		if e := c.sameEndpointLocked(res, r.Endpoint, id); e != nil && e.generation == r.Generation {
			return e, nil
		}
	}
	return nil, nil
}

// install makes e, connected, the primary endpoint of its resource (see
// installLocked), counts its stream goroutine (wg), which the caller
// starts, and closes the endpoint it replaces. It fails once the core
// closes, and when e's socket became live under another resource while e
// was connecting (another path to it); e's connection is then closed.
func (c *core) install(e *entry) (*entry, error) {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		e.conn.Close(errShuttingDown)
		return nil, errShuttingDown
	}
	if err := c.conflictLocked(e.resource, e.path, e.id); err != nil {
		c.mu.Unlock()
		e.conn.Close(err)
		return nil, err
	}
	old := c.installLocked(e, time.Now())
	c.wg.Add(1) // under the lock: Close sets closing before it waits
	c.mu.Unlock()
	if old != nil {
		old.conn.Close(errors.New("replaced before its first update"))
	}
	return old, nil
}

// applyDevices replaces the resource's device set with an update from e
// (last writer wins), unless e's end was handled or the core closes. devs
// are within the bounds (see validDevices).
func (c *core) applyDevices(e *entry, devs []endpoint.Device) {
	c.mu.Lock()
	if e.closed || c.closing {
		c.mu.Unlock()
		return
	}
	res := c.resources[e.resource]
	first := e.state == StateConnecting
	e.state = StateLive
	res.devices = make(map[string]*device, len(devs))
	res.devicesChanged()
	for _, d := range devs {
		res.devices[d.ID] = &device{id: d.ID, healthy: d.Healthy, numa: d.NUMANodes}
	}
	c.changedLocked(res)
	healthy, total := res.healthyCount(), len(res.devices)
	c.mu.Unlock()
	c.log.Debug("device update", "resource", e.resource, "endpoint", e.path, "devices", total, "healthy", healthy, "first", first)
	c.persistSoon()
}

// endStream handles the end of e's stream, unless its end was handled
// already or the core closes.
func (c *core) endStream(e *entry, err error) {
	c.mu.Lock()
	if e.closed || c.closing {
		c.mu.Unlock()
		return
	}
	c.log.Warn("ListAndWatch ended unexpectedly", "resource", e.resource, "endpoint", e.path, "error", err)
	c.stopLocked(e, time.Now(), err)
	c.mu.Unlock()
	c.persistSoon()
}

// deregister stops the endpoint of resource at path when its generation is
// generation, and returns it; nil when there is none.
func (c *core) deregister(resource, path, generation string) (*entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return nil, errShuttingDown
	}
	res := c.resources[resource]
	var e *entry
	if res != nil {
		e = res.endpoints[path]
	}
	if e == nil || e.closed || e.generation != generation {
		return nil, nil
	}
	c.stopLocked(e, time.Now(), errors.New("deregistered"))
	return e, nil
}

// shutdown marks the core closing, so that nothing changes its endpoints
// any more, and returns the connections still open. It reports false when
// it was closing already.
func (c *core) shutdown() ([]*endpoint.Conn, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return nil, false
	}
	c.closing = true
	var conns []*endpoint.Conn
	for _, res := range c.resources {
		for _, e := range res.endpoints {
			if e.conn != nil && !e.closed {
				conns = append(conns, e.conn)
			}
		}
	}
	return conns, true
}

// load adds the resources and allocations of saved state d, every endpoint
// stopped (closed: no stream), and returns the endpoints, to redial.
func (c *core) load(d *store.Data, now time.Time) []*entry {
	var restored []*entry
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range d.Resources {
		res := &resource{name: r.Name, devices: map[string]*device{}, endpoints: map[string]*entry{}, stoppedAt: now}
		for _, dv := range r.Devices {
			res.devices[dv.ID] = &device{id: dv.ID, healthy: dv.Healthy, numa: dv.NUMANodes}
		}
		for _, se := range r.Endpoints {
			c.seq++
			e := &entry{
				resource: r.Name, path: se.Endpoint, socketPath: se.SocketPath, generation: se.Generation,
				regPath: RegistrationPath(se.RegistrationPath), versions: se.Versions,
				opts:  endpoint.Options{PreStartRequired: se.PreStartRequired, PreferredAllocation: se.Preferred},
				state: StateStopped, seq: c.seq, registered: se.Registered, stopped: now, closed: true,
			}
			res.endpoints[e.path] = e
			if se.Primary || res.primary == nil {
				res.primary = e
			}
			restored = append(restored, e)
		}
		c.resources[r.Name] = res
	}
	c.ledger.restore(d.Allocations, c.log)
	return restored
}

// settleRestored ends the restore: a resource whose endpoints were not
// redialled has every device unhealthy and its grace period running; every
// resource is staged and published.
func (c *core) settleRestored(now time.Time) {
	c.mu.Lock()
	for _, res := range c.resources {
		if res.primary == nil || res.primary.closed {
			for _, dv := range res.devices {
				dv.healthy = false
			}
			res.devicesChanged()
			res.stoppedAt = now
		}
		c.changedLocked(res)
	}
	c.mu.Unlock()
	c.poke()
}

// installLocked makes e the primary endpoint of its resource and returns
// the live endpoint it replaces, if any (marked closed): the one on the
// same path, or else the one on another path to the same socket.
func (c *core) installLocked(e *entry, now time.Time) *entry {
	res := c.resources[e.resource]
	if res == nil {
		res = &resource{name: e.resource, devices: map[string]*device{}, endpoints: map[string]*entry{}}
		c.resources[e.resource] = res
	}
	old := res.endpoints[e.path]
	if old == nil || old.closed {
		old = nil // none, or already handled
		if o := c.sameEndpointLocked(res, e.path, e.id); o != nil {
			old = o
			delete(res.endpoints, o.path)
		}
	}
	if old != nil {
		old.closed = true
		c.unindexLocked(old)
	}
	c.indexLocked(e)
	c.seq++
	e.seq = c.seq
	if e.registered.IsZero() {
		e.registered = now
	}
	e.state = StateConnecting
	res.endpoints[e.path] = e
	// Stopped endpoints are only kept while nothing is live.
	for p, o := range res.endpoints {
		if o != e && o.state == StateStopped {
			delete(res.endpoints, p)
		}
	}
	res.primary = e
	res.stoppedAt = time.Time{}
	c.changedLocked(res)
	c.changesLocked(now, 1)
	return old
}

// stopLocked handles the end of e: with other endpoints still there a
// survivor becomes primary; as the last one it stays, stopped, with every
// device unhealthy (capacity kept) until the grace period ends.
func (c *core) stopLocked(e *entry, now time.Time, why error) {
	e.closed = true
	c.unindexLocked(e)
	if conn := e.conn; conn != nil {
		c.wg.Add(1)
		go func() { defer c.wg.Done(); conn.Close(why) }()
	}
	e.state = StateStopped
	e.stopped = now
	c.changesLocked(now, 1)
	res := c.resources[e.resource]
	if res == nil || res.endpoints[e.path] != e {
		return
	}
	var survivor *entry
	for _, o := range res.endpoints {
		if o != e && !o.closed && (survivor == nil || o.seq > survivor.seq) {
			survivor = o
		}
	}
	if survivor != nil {
		delete(res.endpoints, e.path)
		if res.primary == e || res.primary == nil || res.primary.closed {
			res.primary = survivor
			c.log.Info("endpoint promoted to primary", "resource", res.name, "endpoint", survivor.path)
		}
	} else {
		for p, o := range res.endpoints {
			if o != e {
				delete(res.endpoints, p)
			}
		}
		res.primary = e
		for _, d := range res.devices {
			d.healthy = false
		}
		res.devicesChanged()
		res.stoppedAt = now
		c.log.Warn("resource has no live endpoint; devices unhealthy until the grace period ends",
			"resource", res.name, "grace_deadline", now.Add(c.grace))
		c.poke()
	}
	c.changedLocked(res)
}
