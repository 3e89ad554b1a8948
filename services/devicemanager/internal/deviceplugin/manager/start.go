package manager

// Container start, the device-plugin part (the kubelet's
// GetDeviceRunContainerOptions): at every start of a container the plugin
// of each of its resources is called with PreStartContainer when its
// options ask for it; a failure fails that start and keeps the
// allocation. And the container's CDI spec (Config.Specs): written after
// every allocation that changed what the container holds, removed when the
// container's devices are released, made to match the allocations at a
// start of the manager, and written again at each container start (so that
// a spec removed by hand, or not written for a failed disk, comes back).

import (
	"context"
	"fmt"
	"slices"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/endpoint"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/cdispec"
)

// ContainerSpecs keeps each allocated container's device-plugin edits as a
// CDI spec where container runtimes find them (cdispec.Specs).
type ContainerSpecs interface {
	// Write writes the container's spec and returns its qualified CDI
	// device name; "" (and no spec) when the edits are empty.
	Write(podUID, container string, e cdispec.Edits) (string, error)
	// Remove removes the container's spec.
	Remove(podUID, container string) error
	// Sync writes the specs of the containers given and removes the rest.
	Sync(containers []cdispec.Container) error
}

var _ ContainerSpecs = (*cdispec.Specs)(nil)

// ContainerStart is the device-plugin part of a container's start.
type ContainerStart struct {
	// Allocations are the container's, by resource name.
	Allocations []allocator.Allocation
	// PreStarted are the resources whose plugins PreStartContainer was
	// called on.
	PreStarted []string
	// Edits are the plugins' envs, mounts, device nodes and annotations,
	// merged (cdispec.Merge).
	Edits cdispec.Edits
	// SpecDevice is the qualified CDI name of the container's own device
	// (its spec holds Edits); empty when Edits has nothing for CDI or no
	// ContainerSpecs is configured.
	SpecDevice string
	// CDIDevices are the plugins' CDI device names, without duplicates.
	CDIDevices []string
}

// StartContainer does the device-plugin part of a start of a container of
// pod: the container's CDI spec written again, then check called with what
// the start would give the container (a container with no devices gives
// an empty ContainerStart), then PreStartContainer on each of its
// resources' plugins that ask for it. An error of check fails the start
// before any plugin is told of it. It runs one at a time with the
// Allocate calls of the same container.
func (m *Manager) StartContainer(ctx context.Context, pod, container string, check func(ContainerStart) error) (ContainerStart, error) {
	if err := bounds.PodUID(pod); err != nil {
		return ContainerStart{}, err
	}
	if err := bounds.ContainerName(container, false); err != nil {
		return ContainerStart{}, err
	}
	ctx, span := tracer.Start(ctx, "start container devices")
	defer span.End()
	span.SetAttributes(attribute.String("pod_uid", pod), attribute.String("container", container))
	fail := func(err error) (ContainerStart, error) {
		span.SetStatus(codes.Error, err.Error())
		return ContainerStart{}, err
	}
	unlock := m.containers.Lock(pod + "\x00" + container)
	defer unlock()

	out := ContainerStart{Allocations: m.containerAllocations(pod, container)}
	if len(out.Allocations) > 0 {
		resps := responses(out.Allocations)
		out.Edits, _ = cdispec.Merge(resps)
		out.CDIDevices = cdispec.CDIDevices(resps)
		if m.specs != nil {
			name, err := m.specs.Write(pod, container, out.Edits)
			if err != nil {
				return fail(err)
			}
			out.SpecDevice = name
		}
	}
	if err := check(out); err != nil {
		return fail(err)
	}
	for _, a := range out.Allocations {
		called, err := m.preStart(ctx, a)
		if err != nil {
			return fail(err)
		}
		if called {
			out.PreStarted = append(out.PreStarted, a.Resource)
		}
	}
	span.SetAttributes(attribute.StringSlice("pre_started", out.PreStarted))
	return out, nil
}

// preStart calls PreStartContainer for allocation a when its resource's
// plugin asks for it, and reports whether it did. A resource with no
// device set any longer is the kubelet's "endpoint not found" error; one
// whose primary endpoint stopped fails when its plugin needs the call.
func (m *Manager) preStart(ctx context.Context, a allocator.Allocation) (bool, error) {
	plugin, required, err := m.startPlugin(a.Resource)
	if err != nil || !required {
		return false, err
	}
	if err := plugin.PreStartContainer(ctx, a.DeviceIDs); err != nil {
		return false, err
	}
	return true, nil
}

// startPlugin returns the plugin a start of a container calls for
// resource, and whether its options ask for PreStartContainer. An
// endpoint restored from the checkpoint and not connected again has no
// options: nothing is asked of it, as the kubelet does.
func (c *core) startPlugin(resource string) (endpoint.Plugin, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res := c.resources[resource]
	if res == nil {
		return nil, false, fmt.Errorf("endpoint not found in cache for a registered resource: %s: %w", resource, errdefs.ErrFailedPrecondition)
	}
	e := res.primary
	if e == nil || e.conn == nil || !e.opts.PreStartRequired {
		return nil, false, nil
	}
	if e.closed || e.state == StateStopped {
		return nil, true, fmt.Errorf("device plugin %s of %s: endpoint %s has been stopped: %w", e.path, resource, e.path, errdefs.ErrUnavailable)
	}
	return e.conn, true, nil
}

// containerAllocations returns the allocations of one container of pod, by
// resource name.
func (c *core) containerAllocations(pod, container string) []allocator.Allocation {
	all := c.ListAllocations(pod)
	return slices.DeleteFunc(all, func(a allocator.Allocation) bool { return a.Container != container })
}

func responses(allocs []allocator.Allocation) []*pluginapi.ContainerAllocateResponse {
	out := make([]*pluginapi.ContainerAllocateResponse, len(allocs))
	for i, a := range allocs {
		out[i] = a.Response
	}
	return out
}

// writeSpec writes the spec of a container whose allocations changed. A
// failure is logged: the allocation stands, and the container's start
// writes the spec again (and fails if it still cannot).
func (m *Manager) writeSpec(ctx context.Context, pod, container string) {
	if m.specs == nil {
		return
	}
	e, conflicts := cdispec.Merge(responses(m.containerAllocations(pod, container)))
	if len(conflicts) > 0 {
		m.log.WarnContext(ctx, "device plugins' answers for one container conflict; the first resource's value is used",
			"pod_uid", pod, "container", container, "conflicts", conflicts)
	}
	if _, err := m.specs.Write(pod, container, e); err != nil {
		m.log.WarnContext(ctx, "CDI spec not written; the container's start writes it again", "pod_uid", pod, "container", container, "error", err)
	}
}

// removeSpecs removes the specs of the containers of pod released.
func (m *Manager) removeSpecs(ctx context.Context, pod string, containers []string) {
	if m.specs == nil {
		return
	}
	for _, c := range containers {
		if err := m.specs.Remove(pod, c); err != nil {
			m.log.WarnContext(ctx, "CDI spec of a released container not removed; the next start of the devicemanager removes it",
				"pod_uid", pod, "container", c, "error", err)
		}
	}
}

// syncSpecs makes the spec directory match the allocations restored: a
// missing spec is written, a stale one removed.
func (m *Manager) syncSpecs() {
	if m.specs == nil {
		return
	}
	var want []cdispec.Container
	all := m.ListAllocations("")
	for i := 0; i < len(all); {
		j := i
		for j < len(all) && all[j].PodUID == all[i].PodUID && all[j].Container == all[i].Container {
			j++
		}
		e, _ := cdispec.Merge(responses(all[i:j]))
		want = append(want, cdispec.Container{PodUID: all[i].PodUID, Container: all[i].Container, Edits: e})
		i = j
	}
	if err := m.specs.Sync(want); err != nil {
		m.log.Warn("CDI specs not all made to match the allocations; each container's start writes its own again", "error", err)
	}
}
