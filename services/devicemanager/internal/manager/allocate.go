package manager

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
)

// maxPickAttempts bounds how often a choice made with the lock released
// (GetPreferredAllocation) is retried when a concurrent allocation took one
// of its devices.
const maxPickAttempts = 5

func validateAllocate(req *AllocateRequest) error {
	if req.PodUID == "" || len(req.PodUID) > 253 {
		return fmt.Errorf("pod UID must be 1 to 253 characters, got %d: %w", len(req.PodUID), errdefs.ErrInvalidArgument)
	}
	if req.Container == "" || len(req.Container) > 253 {
		return fmt.Errorf("container name must be 1 to 253 characters, got %d: %w", len(req.Container), errdefs.ErrInvalidArgument)
	}
	if len(req.Resources) == 0 {
		return fmt.Errorf("no resources requested: %w", errdefs.ErrInvalidArgument)
	}
	seen := map[string]bool{}
	for _, rr := range req.Resources {
		name := rr.Name
		if name == "" {
			return fmt.Errorf("resource name is empty: %w", errdefs.ErrInvalidArgument)
		}
		if seen[name] {
			return fmt.Errorf("resource %q requested twice: %w", name, errdefs.ErrInvalidArgument)
		}
		seen[name] = true
		if rr.Count <= 0 {
			return fmt.Errorf("count of %q must be > 0, got %d: %w", name, rr.Count, errdefs.ErrInvalidArgument)
		}
		must := rr.MustInclude
		if int64(len(must)) > rr.Count {
			return fmt.Errorf("%d must-include devices of %q exceed the count %d: %w", len(must), name, rr.Count, errdefs.ErrInvalidArgument)
		}
		mseen := map[string]bool{}
		for _, id := range must {
			if id == "" || mseen[id] {
				return fmt.Errorf("must-include devices of %q: empty or repeated ID %q: %w", name, id, errdefs.ErrInvalidArgument)
			}
			mseen[id] = true
		}
	}
	return nil
}

// pick is the devices chosen for one resource of a request, reserved under
// the lock, with the endpoint that will allocate them.
type pick struct {
	key  allocKey
	ids  []string
	ep   *endpoint
	resp *pluginapi.ContainerAllocateResponse
}

// Allocate chooses devices for one container and asks their plugins to
// allocate them (one Allocate RPC per resource, then PreStartContainer when
// the plugin requires it). The same request again returns the saved answer
// without calling the plugin. Devices are reserved before any plugin call,
// so two concurrent requests never get the same device; any failure
// releases every reservation of the request. The checkpoint is written
// before Allocate returns.
func (m *Manager) Allocate(ctx context.Context, req *AllocateRequest) ([]ResourceAllocation, error) {
	if err := validateAllocate(req); err != nil {
		return nil, err
	}
	ctx, span := tracer.Start(ctx, "allocate")
	defer span.End()
	span.SetAttributes(attribute.String("pod_uid", req.PodUID), attribute.String("container", req.Container))
	resp, err := m.allocate(ctx, req)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		for _, rr := range req.Resources {
			m.metrics.allocations.WithLabelValues(rr.Name, "failed").Inc()
		}
		return nil, err
	}
	return resp, nil
}

func (m *Manager) allocate(ctx context.Context, req *AllocateRequest) ([]ResourceAllocation, error) {
	unlock := m.allocLocks.Lock(req.PodUID + "\x00" + req.Container)
	defer unlock()

	// Saved answers, and the resources that need new devices.
	var todo []ResourceRequest
	m.mu.Lock()
	for _, rr := range req.Resources {
		key := allocKey{req.PodUID, req.Container, rr.Name}
		if a := m.allocs[key]; a != nil {
			if int64(len(a.ids)) != rr.Count {
				m.mu.Unlock()
				return nil, fmt.Errorf("pod %q container %q changed request for resource %q from %d to %d: %w",
					key.pod, key.container, key.resource, len(a.ids), rr.Count, errdefs.ErrFailedPrecondition)
			}
			continue
		}
		todo = append(todo, rr)
	}
	m.mu.Unlock()

	var picks []*pick
	rollback := func() {
		m.mu.Lock()
		for _, p := range picks {
			m.unreserveLocked(p.key)
		}
		m.mu.Unlock()
	}
	for _, rr := range todo {
		p, err := m.choose(ctx, allocKey{req.PodUID, req.Container, rr.Name}, rr)
		if err != nil {
			rollback()
			return nil, err
		}
		picks = append(picks, p)
	}
	for _, p := range picks {
		if err := m.callPlugin(ctx, p); err != nil {
			rollback()
			return nil, err
		}
	}
	if len(picks) > 0 {
		now, traceID := time.Now(), telemetry.TraceID(ctx)
		m.mu.Lock()
		for _, p := range picks {
			m.allocs[p.key] = &allocation{key: p.key, ids: p.ids, resp: p.resp, traceID: traceID, at: now}
			if res := m.resources[p.key.resource]; res != nil {
				m.changedLocked(res)
			} else {
				m.version++
			}
		}
		m.mu.Unlock()
		if err := m.persist(); err != nil {
			m.mu.Lock()
			for _, p := range picks {
				delete(m.allocs, p.key)
				m.unreserveLocked(p.key)
				if res := m.resources[p.key.resource]; res != nil {
					m.changedLocked(res)
				}
			}
			m.mu.Unlock()
			if err2 := m.persist(); err2 != nil {
				m.log.ErrorContext(ctx, "writing checkpoint after rollback", "error", err2)
			}
			return nil, fmt.Errorf("allocation not saved: %v: %w", err, errdefs.ErrInternal)
		}
		for _, p := range picks {
			m.metrics.allocations.WithLabelValues(p.key.resource, "allocated").Inc()
			m.log.InfoContext(ctx, "devices allocated", "pod_uid", p.key.pod, "container", p.key.container,
				"resource", p.key.resource, "devices", p.ids)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ResourceAllocation
	for _, rr := range req.Resources {
		a := m.allocs[allocKey{req.PodUID, req.Container, rr.Name}]
		if a == nil {
			// Released by a concurrent Release after it was made.
			return nil, fmt.Errorf("allocation of %q for pod %q container %q was released while being made: %w",
				rr.Name, req.PodUID, req.Container, errdefs.ErrFailedPrecondition)
		}
		out = append(out, m.allocationViewLocked(a))
	}
	if len(picks) == 0 {
		for _, rr := range req.Resources {
			m.metrics.allocations.WithLabelValues(rr.Name, "reused").Inc()
		}
	}
	return out, nil
}

// choose picks and reserves devices for one resource.
func (m *Manager) choose(ctx context.Context, key allocKey, rr ResourceRequest) (*pick, error) {
	count := int(rr.Count)
	must := rr.MustInclude
	for attempt := 1; ; attempt++ {
		m.mu.Lock()
		res := m.resources[key.resource]
		if res == nil {
			m.mu.Unlock()
			return nil, fmt.Errorf("cannot allocate unregistered device %s: %w", key.resource, errdefs.ErrNotFound)
		}
		ep := res.primary
		healthy := 0
		var free []string
		owners := m.owners[key.resource]
		for _, id := range res.sortedIDs() {
			if res.devices[id].healthy {
				healthy++
				if _, taken := owners[id]; !taken {
					free = append(free, id)
				}
			}
		}
		if ep == nil || ep.closed || healthy == 0 {
			m.mu.Unlock()
			return nil, fmt.Errorf("no healthy devices present; cannot allocate unhealthy devices %s: %w", key.resource, errdefs.ErrFailedPrecondition)
		}
		for _, id := range must {
			if !slices.Contains(free, id) {
				m.mu.Unlock()
				return nil, fmt.Errorf("must-include device %q of %s is not healthy and free: %w", id, key.resource, errdefs.ErrFailedPrecondition)
			}
		}
		if len(free) < count {
			m.mu.Unlock()
			return nil, fmt.Errorf("requested number of devices unavailable for %s. Requested: %d, Available: %d: %w",
				key.resource, count, len(free), errdefs.ErrFailedPrecondition)
		}
		if !ep.opts.GetGetPreferredAllocationAvailable() {
			ids := slices.Clone(must)
			for _, id := range free {
				if len(ids) == count {
					break
				}
				if !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
			}
			slices.Sort(ids)
			m.reserveLocked(key, ids)
			m.mu.Unlock()
			return &pick{key: key, ids: ids, ep: ep}, nil
		}
		m.mu.Unlock()

		ids, err := m.preferred(ctx, ep, free, must, count)
		if err != nil {
			return nil, err
		}
		m.mu.Lock()
		ok := true
		res = m.resources[key.resource]
		for _, id := range ids {
			_, taken := m.owners[key.resource][id]
			if res == nil || res.devices[id] == nil || !res.devices[id].healthy || taken {
				ok = false
				break
			}
		}
		if ok {
			m.reserveLocked(key, ids)
			m.mu.Unlock()
			return &pick{key: key, ids: ids, ep: ep}, nil
		}
		m.mu.Unlock()
		if attempt == maxPickAttempts {
			return nil, fmt.Errorf("devices of %s preferred by its plugin were taken concurrently %d times: %w", key.resource, attempt, errdefs.ErrFailedPrecondition)
		}
	}
}

// preferred asks the plugin for its choice and checks it: a subset of what
// was offered, the right size, including every must-include ID.
func (m *Manager) preferred(ctx context.Context, ep *endpoint, avail, must []string, count int) ([]string, error) {
	cctx, cancel := context.WithTimeout(ctx, preferredTimout)
	defer cancel()
	resp, err := ep.client.GetPreferredAllocation(cctx, &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
			AvailableDeviceIDs: avail, MustIncludeDeviceIDs: must, AllocationSize: int32(count),
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("device plugin %s (%s) GetPreferredAllocation rpc failed with err: %s: %w",
			ep.resource, ep.path, status.Convert(err).Message(), pluginErrKind(err))
	}
	var ids []string
	if crs := resp.GetContainerResponses(); len(crs) > 0 {
		ids = slices.Clone(crs[0].GetDeviceIDs())
	}
	bad := func(why string) error {
		return fmt.Errorf("device plugin %s (%s) GetPreferredAllocation returned %v: %s: %w", ep.resource, ep.path, ids, why, errdefs.ErrInternal)
	}
	if len(ids) != count {
		return nil, bad(fmt.Sprintf("%d devices, want %d", len(ids), count))
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if seen[id] {
			return nil, bad(fmt.Sprintf("device %q twice", id))
		}
		seen[id] = true
		if !slices.Contains(avail, id) {
			return nil, bad(fmt.Sprintf("device %q was not offered", id))
		}
	}
	for _, id := range must {
		if !seen[id] {
			return nil, bad(fmt.Sprintf("must-include device %q missing", id))
		}
	}
	slices.Sort(ids)
	return ids, nil
}

// callPlugin runs Allocate, then PreStartContainer when required.
func (m *Manager) callPlugin(ctx context.Context, p *pick) error {
	start := time.Now()
	actx, cancel := context.WithTimeout(ctx, allocateTimeout)
	resp, err := p.ep.client.Allocate(actx, &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: p.ids}},
	})
	cancel()
	m.metrics.allocDuration.WithLabelValues(p.key.resource).Observe(time.Since(start).Seconds())
	if err != nil {
		return fmt.Errorf("device plugin %s (%s) Allocate rpc failed with err: %s: %w",
			p.key.resource, p.ep.path, status.Convert(err).Message(), pluginErrKind(err))
	}
	if len(resp.GetContainerResponses()) == 0 {
		return fmt.Errorf("device plugin %s (%s): no containers return in allocation response %v: %w",
			p.key.resource, p.ep.path, resp, errdefs.ErrInternal)
	}
	p.resp = resp.GetContainerResponses()[0]
	if p.ep.opts.GetPreStartRequired() {
		pctx, cancel := context.WithTimeout(ctx, preStartTimeout)
		_, err := p.ep.client.PreStartContainer(pctx, &pluginapi.PreStartContainerRequest{DevicesIds: p.ids})
		cancel()
		if err != nil {
			return fmt.Errorf("device plugin %s (%s) PreStartContainer rpc failed with err: %s: %w",
				p.key.resource, p.ep.path, status.Convert(err).Message(), pluginErrKind(err))
		}
	}
	return nil
}

func (m *Manager) reserveLocked(key allocKey, ids []string) {
	owners := m.owners[key.resource]
	if owners == nil {
		owners = map[string]allocKey{}
		m.owners[key.resource] = owners
	}
	for _, id := range ids {
		owners[id] = key
	}
}

func (m *Manager) unreserveLocked(key allocKey) int {
	n := 0
	owners := m.owners[key.resource]
	for id, k := range owners {
		if k == key {
			delete(owners, id)
			n++
		}
	}
	if len(owners) == 0 {
		delete(m.owners, key.resource)
	}
	return n
}

func (m *Manager) allocationViewLocked(a *allocation) ResourceAllocation {
	v := ResourceAllocation{Resource: a.key.resource, DeviceIDs: slices.Clone(a.ids), Response: a.resp}
	res := m.resources[a.key.resource]
	for _, id := range a.ids {
		healthy := res != nil && res.devices[id] != nil && res.devices[id].healthy
		v.Devices = append(v.Devices, DeviceStatus{ID: id, Healthy: healthy})
	}
	return v
}

// Release frees the devices of a pod, or of one of its containers when
// container is set. It is idempotent and returns the number of devices
// freed.
func (m *Manager) Release(ctx context.Context, pod, container string) (int64, error) {
	if pod == "" {
		return 0, fmt.Errorf("pod UID is empty: %w", errdefs.ErrInvalidArgument)
	}
	m.mu.Lock()
	var n int64
	for key, a := range m.allocs {
		if key.pod != pod || (container != "" && key.container != container) {
			continue
		}
		delete(m.allocs, key)
		m.unreserveLocked(key)
		n += int64(len(a.ids))
		m.metrics.released.WithLabelValues(key.resource).Add(float64(len(a.ids)))
		if res := m.resources[key.resource]; res != nil {
			m.changedLocked(res)
		} else {
			m.version++
		}
	}
	m.mu.Unlock()
	if n == 0 {
		return 0, nil
	}
	m.log.InfoContext(ctx, "devices released", "pod_uid", pod, "container", container, "devices", n)
	if err := m.persist(); err != nil {
		return n, fmt.Errorf("release not saved: %v: %w", err, errdefs.ErrInternal)
	}
	return n, nil
}

// ListAllocations returns every allocation (of one pod when pod is set),
// sorted by pod, container and resource. The plugin responses are shared:
// callers must not modify them.
func (m *Manager) ListAllocations(pod string) []Allocation {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := slices.SortedFunc(maps.Keys(m.allocs), func(a, b allocKey) int {
		return strings.Compare(a.pod+"\x00"+a.container+"\x00"+a.resource, b.pod+"\x00"+b.container+"\x00"+b.resource)
	})
	var out []Allocation
	for _, k := range keys {
		if pod != "" && k.pod != pod {
			continue
		}
		a := m.allocs[k]
		out = append(out, Allocation{
			PodUID: k.pod, Container: k.container, Resource: k.resource,
			DeviceIDs: slices.Clone(a.ids), Response: a.resp, TraceID: a.traceID, Allocated: a.at,
		})
	}
	return out
}

// responseBytes encodes a plugin response for the checkpoint.
func responseBytes(r *pluginapi.ContainerAllocateResponse) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(r)
}
