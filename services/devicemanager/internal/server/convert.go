package server

import (
	"fmt"
	"maps"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/cdispec"
)

func timestamp(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

var regPaths = map[manager.RegistrationPath]dmv1.RegistrationPath{
	manager.PathPluginsRegistry: dmv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY,
	manager.PathKubeletSock:     dmv1.RegistrationPath_REGISTRATION_PATH_KUBELET_SOCK,
}

var states = map[manager.EndpointState]dmv1.EndpointState{
	manager.StateConnecting: dmv1.EndpointState_ENDPOINT_STATE_CONNECTING,
	manager.StateLive:       dmv1.EndpointState_ENDPOINT_STATE_LIVE,
	manager.StateStopped:    dmv1.EndpointState_ENDPOINT_STATE_STOPPED,
}

func resourceToAPI(r manager.ResourceInfo) *dmv1.Resource {
	out := &dmv1.Resource{
		Name: r.Name, Capacity: r.Capacity, Allocatable: r.Allocatable, Free: r.Free,
		HealthyDeviceIds: r.Healthy, UnhealthyDeviceIds: r.Unhealthy, AllocatedDeviceIds: r.Allocated,
		GraceDeadline: timestamp(r.GraceDeadline),
	}
	for _, e := range r.Endpoints {
		out.Endpoints = append(out.Endpoints, &dmv1.Endpoint{
			Endpoint: e.Endpoint, SocketPath: e.SocketPath, Generation: e.Generation,
			RegistrationPath: regPaths[e.Path], State: states[e.State], Versions: e.Versions, Primary: e.Primary,
			Options: &dmv1.DevicePluginOptions{
				PreStartRequired: e.PreStartRequired, GetPreferredAllocationAvailable: e.PreferredAllocation,
			},
			RegisteredTime: timestamp(e.Registered), StoppedTime: timestamp(e.Stopped),
		})
	}
	return out
}

func changeToAPI(instanceID string, c manager.Change) *dmv1.WatchResourcesResponse {
	t := dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_UPDATED
	if c.Removed {
		t = dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_REMOVED
	}
	return &dmv1.WatchResourcesResponse{
		InstanceId: instanceID,
		Item:       &dmv1.WatchResourcesResponse_Change{Change: &dmv1.ResourceChange{Type: t, Resource: resourceToAPI(c.Resource), Revision: c.Revision}},
	}
}

func registrationFromAPI(req *dmv1.RegisterPluginRequest) manager.Registration {
	return manager.Registration{
		Resource: req.GetResourceName(), Endpoint: req.GetEndpoint(), Versions: req.GetVersions(),
		SocketPath: req.GetSocketPath(), Generation: req.GetGeneration(), Path: manager.PathPluginsRegistry,
	}
}

// kinds maps the container kinds of the API to the allocator's; a kind
// not listed is passed on as its name, for the allocator to refuse.
var kinds = map[dmv1.ContainerKind]allocator.ContainerKind{
	dmv1.ContainerKind_CONTAINER_KIND_UNSPECIFIED: allocator.KindApp,
	dmv1.ContainerKind_CONTAINER_KIND_APP:         allocator.KindApp,
	dmv1.ContainerKind_CONTAINER_KIND_INIT:        allocator.KindInit,
	dmv1.ContainerKind_CONTAINER_KIND_SIDECAR:     allocator.KindSidecar,
}

func kindFromAPI(k dmv1.ContainerKind) allocator.ContainerKind {
	if kind, ok := kinds[k]; ok {
		return kind
	}
	return allocator.ContainerKind(fmt.Sprint(int32(k)))
}

func kindToAPI(k allocator.ContainerKind) dmv1.ContainerKind {
	switch k {
	case allocator.KindInit:
		return dmv1.ContainerKind_CONTAINER_KIND_INIT
	case allocator.KindSidecar:
		return dmv1.ContainerKind_CONTAINER_KIND_SIDECAR
	default:
		return dmv1.ContainerKind_CONTAINER_KIND_APP
	}
}

func allocateRequestFromAPI(req *dmv1.AllocateRequest) *allocator.Request {
	out := &allocator.Request{
		PodUID: req.GetPodUid(), Container: req.GetContainerName(), Kind: kindFromAPI(req.GetContainerKind()),
		PodNamespace: req.GetPodNamespace(), PodName: req.GetPodName(),
	}
	for _, rr := range req.GetResources() {
		out.Resources = append(out.Resources, allocator.ResourceRequest{
			Name: rr.GetResourceName(), Count: rr.GetCount(), MustInclude: rr.GetMustIncludeDeviceIds(),
		})
	}
	return out
}

func resourceAllocationToAPI(a allocator.ResourceAllocation) *dmv1.ResourceAllocation {
	out := &dmv1.ResourceAllocation{ResourceName: a.Resource, DeviceIds: a.DeviceIDs, ContainerResponse: responseToAPI(a.Response)}
	for _, d := range a.Devices {
		h := dmv1.DeviceHealth_DEVICE_HEALTH_UNHEALTHY
		if d.Healthy {
			h = dmv1.DeviceHealth_DEVICE_HEALTH_HEALTHY
		}
		out.Devices = append(out.Devices, &dmv1.DeviceStatus{Id: d.ID, Health: h})
	}
	return out
}

func allocationToAPI(a allocator.Allocation) *dmv1.Allocation {
	return &dmv1.Allocation{
		PodUid: a.PodUID, PodNamespace: a.PodNamespace, PodName: a.PodName, ContainerName: a.Container, ResourceName: a.Resource, DeviceIds: a.DeviceIDs,
		ContainerResponse: responseToAPI(a.Response), TraceId: a.TraceID, AllocatedTime: timestamp(a.Allocated),
		ContainerKind: kindToAPI(a.Kind),
	}
}

// responseToAPI mirrors a plugin's ContainerAllocateResponse into nodeplug's
// message.
func responseToAPI(r *pluginapi.ContainerAllocateResponse) *dmv1.ContainerAllocateResponse {
	out := &dmv1.ContainerAllocateResponse{Envs: maps.Clone(r.GetEnvs()), Annotations: maps.Clone(r.GetAnnotations())}
	for _, mt := range r.GetMounts() {
		out.Mounts = append(out.Mounts, &dmv1.Mount{ContainerPath: mt.GetContainerPath(), HostPath: mt.GetHostPath(), ReadOnly: mt.GetReadOnly()})
	}
	for _, d := range r.GetDevices() {
		out.Devices = append(out.Devices, &dmv1.DeviceSpec{ContainerPath: d.GetContainerPath(), HostPath: d.GetHostPath(), Permissions: d.GetPermissions()})
	}
	for _, c := range r.GetCdiDevices() {
		out.CdiDevices = append(out.CdiDevices, &dmv1.CDIDevice{Name: c.GetName()})
	}
	return out
}

func editsToAPI(e cdispec.Edits) *dmv1.ContainerEdits {
	out := &dmv1.ContainerEdits{Envs: e.Envs, Annotations: e.Annotations}
	for _, m := range e.Mounts {
		out.Mounts = append(out.Mounts, &dmv1.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly})
	}
	for _, d := range e.Devices {
		out.Devices = append(out.Devices, &dmv1.DeviceSpec{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
	}
	return out
}
