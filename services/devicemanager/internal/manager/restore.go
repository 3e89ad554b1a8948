package manager

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/services/devicemanager/internal/checkpoint"
)

// persist writes the checkpoint if the state changed since the last write.
// Concurrent callers share writes: a caller whose change is already in a
// written snapshot returns at once.
func (m *Manager) persist() error {
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	m.mu.Lock()
	v := m.version
	if v == m.saved {
		m.mu.Unlock()
		return nil
	}
	b, err := m.encodeLocked()
	m.mu.Unlock()
	if err != nil {
		return err
	}
	if err := checkpoint.WriteFile(m.ckptPath, b); err != nil {
		return err
	}
	m.saved = v
	return nil
}

// encodeLocked encodes the checkpoint. Each resource keeps its encoding
// until it changes (changedLocked drops it) and an allocation never
// changes, so a write re-encodes only what changed since the last one.
func (m *Manager) encodeLocked() ([]byte, error) {
	resources := make([][]byte, 0, len(m.resources))
	for _, name := range slices.Sorted(maps.Keys(m.resources)) {
		res := m.resources[name]
		if res.enc == nil {
			b, err := json.Marshal(m.checkpointResourceLocked(res))
			if err != nil {
				return nil, fmt.Errorf("encode resource %s: %w", name, err)
			}
			res.enc = b
		}
		resources = append(resources, res.enc)
	}
	keys := slices.SortedFunc(maps.Keys(m.allocs), func(a, b allocKey) int {
		return strings.Compare(a.pod+"\x00"+a.container+"\x00"+a.resource, b.pod+"\x00"+b.container+"\x00"+b.resource)
	})
	allocations := make([][]byte, 0, len(keys))
	for _, k := range keys {
		a := m.allocs[k]
		if a.enc == nil {
			resp, err := responseBytes(a.resp)
			if err != nil {
				return nil, fmt.Errorf("encode allocation of %s for %s/%s: %w", k.resource, k.pod, k.container, err)
			}
			b, err := json.Marshal(checkpoint.Allocation{
				PodUID: k.pod, ContainerName: k.container, ResourceName: k.resource,
				DeviceIDs: a.ids, Response: resp, TraceID: a.traceID, Allocated: a.at,
			})
			if err != nil {
				return nil, fmt.Errorf("encode allocation of %s for %s/%s: %w", k.resource, k.pod, k.container, err)
			}
			a.enc = b
		}
		allocations = append(allocations, a.enc)
	}
	return checkpoint.MarshalParts(resources, allocations), nil
}

func (m *Manager) checkpointResourceLocked(res *resource) checkpoint.Resource {
	r := checkpoint.Resource{Name: res.name, Devices: make([]checkpoint.Device, 0, len(res.devices)), Endpoints: []checkpoint.Endpoint{}}
	for _, id := range res.sortedIDs() {
		dev := res.devices[id]
		r.Devices = append(r.Devices, checkpoint.Device{ID: id, Healthy: dev.healthy, NUMANodes: dev.numa})
	}
	eps := slices.SortedFunc(maps.Values(res.endpoints), func(a, b *endpoint) int { return cmp.Compare(a.seq, b.seq) })
	for _, e := range eps {
		r.Endpoints = append(r.Endpoints, checkpoint.Endpoint{
			Endpoint: e.path, SocketPath: e.socketPath, Generation: e.generation,
			RegistrationPath: string(e.regPath), Versions: e.versions,
			PreStartRequired: e.opts.GetPreStartRequired(), Preferred: e.opts.GetGetPreferredAllocationAvailable(),
			Registered: e.registered, Primary: e == res.primary,
		})
	}
	return r
}

// Restore loads the checkpoint and redials the endpoints it records.
// Endpoints still serving are live again at once, with their recorded
// generation, so a later registration of the same generation is a no-op.
// Resources whose endpoints do not answer are kept with every device
// unhealthy until a plugin registers or the grace period ends. A corrupt
// checkpoint is moved aside, logged as an error, and the manager starts
// empty. Call Restore once, before serving.
func (m *Manager) Restore(ctx context.Context) error {
	d, err := checkpoint.Load(m.ckptPath)
	if err != nil {
		aside, rerr := checkpoint.MoveAside(m.ckptPath, time.Now())
		if rerr != nil {
			return fmt.Errorf("checkpoint %s is unusable (%v) and could not be moved aside: %w", m.ckptPath, err, rerr)
		}
		m.log.Error("CHECKPOINT UNUSABLE: moved aside; starting with no allocations and no endpoints",
			"path", m.ckptPath, "moved_to", aside, "error", err)
		return nil
	}
	if d == nil {
		m.log.Info("no checkpoint; starting empty", "path", m.ckptPath)
		return nil
	}
	now := time.Now()
	var restored []*endpoint
	m.mu.Lock()
	for _, r := range d.Resources {
		res := &resource{name: r.Name, devices: map[string]*device{}, endpoints: map[string]*endpoint{}, stoppedAt: now}
		for _, dv := range r.Devices {
			res.devices[dv.ID] = &device{id: dv.ID, healthy: dv.Healthy, numa: dv.NUMANodes}
		}
		for _, e := range r.Endpoints {
			m.seq++
			ep := &endpoint{
				resource: r.Name, path: e.Endpoint, socketPath: e.SocketPath, generation: e.Generation,
				regPath: RegistrationPath(e.RegistrationPath), versions: e.Versions,
				opts:  &pluginapi.DevicePluginOptions{PreStartRequired: e.PreStartRequired, GetPreferredAllocationAvailable: e.Preferred},
				state: StateStopped, seq: m.seq, registered: e.Registered, stopped: now, closed: true,
			}
			res.endpoints[ep.path] = ep
			if e.Primary || res.primary == nil {
				res.primary = ep
			}
			restored = append(restored, ep)
		}
		m.resources[r.Name] = res
	}
	for _, a := range d.Allocations {
		resp := &pluginapi.ContainerAllocateResponse{}
		if err := proto.Unmarshal(a.Response, resp); err != nil {
			m.log.Error("checkpoint allocation with an unreadable plugin response; keeping its devices allocated",
				"pod_uid", a.PodUID, "container", a.ContainerName, "resource", a.ResourceName, "error", err)
		}
		key := allocKey{a.PodUID, a.ContainerName, a.ResourceName}
		m.allocs[key] = &allocation{key: key, ids: a.DeviceIDs, resp: resp, traceID: a.TraceID, at: a.Allocated}
		m.reserveLocked(key, a.DeviceIDs)
	}
	m.mu.Unlock()
	m.log.Info("checkpoint restored", "path", m.ckptPath, "resources", len(d.Resources), "endpoints", len(restored), "allocations", len(d.Allocations))

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
			res.stoppedAt = now
		}
		m.changedLocked(res)
	}
	m.mu.Unlock()
	m.poke()
	return m.persist()
}

// redial reconnects an endpoint recorded in the checkpoint.
func (m *Manager) redial(ctx context.Context, old *endpoint) {
	ctx, span := tracer.Start(ctx, "redial "+old.resource, trace.WithNewRoot())
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, redialTimeout)
	defer cancel()
	dialPath, err := m.confiner.Resolve(old.path)
	if err != nil {
		m.log.InfoContext(ctx, "recorded endpoint not redialled", "resource", old.resource, "endpoint", old.path, "error", err)
		return
	}
	ep := &endpoint{
		resource: old.resource, path: old.path, dialPath: dialPath, socketPath: old.socketPath,
		generation: old.generation, regPath: old.regPath, versions: old.versions, registered: old.registered,
	}
	unlock := m.regLocks.Lock(ep.path)
	defer unlock()
	lw, err := m.connect(ctx, ep)
	if err != nil {
		m.log.InfoContext(ctx, "recorded endpoint does not answer; waiting for its plugin to register again",
			"resource", old.resource, "endpoint", old.path, "error", errors.Unwrap(err))
		return
	}
	if _, err := m.install(ep); err != nil {
		return
	}
	go m.run(ep, lw)
	m.log.InfoContext(ctx, "recorded endpoint live again", "resource", ep.resource, "endpoint", ep.path, "generation", ep.generation)
}
