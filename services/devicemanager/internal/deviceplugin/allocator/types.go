// Package allocator chooses devices for containers: it checks the shape of
// a request (ValidateRequest) and, from a Snapshot of one resource it is
// given, computes a choice and returns it (Lowest; Offer and MergePreferred
// for a plugin's preferred allocation). It holds no state and calls
// nothing: the devicemanager's state core (package manager) takes the
// snapshot, reserves the choice, calls the plugin and records the
// allocation.
package allocator

import (
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Request asks for devices for one container.
type Request struct {
	PodUID    string
	Container string
	Resources []ResourceRequest
	// PodNamespace and PodName name the pod, optionally (both or
	// neither). The first Allocate of a pod UID fixes them.
	PodNamespace string
	PodName      string
}

// ResourceRequest asks for Count devices of one resource, including the
// MustInclude ones.
type ResourceRequest struct {
	Name        string
	Count       int64
	MustInclude []string
}

// DeviceStatus is a device's current health.
type DeviceStatus struct {
	ID      string
	Healthy bool
}

// ResourceAllocation is what a container got of one resource: the devices,
// the plugin's answer and each device's current health.
type ResourceAllocation struct {
	Resource  string
	DeviceIDs []string
	Response  *pluginapi.ContainerAllocateResponse
	Devices   []DeviceStatus
	// PodNamespace and PodName are the pod's, as its first Allocate fixed
	// them; empty for a pod known only by its UID.
	PodNamespace string
	PodName      string
}

// Allocation is one container's devices of one resource, as listed.
type Allocation struct {
	PodUID       string
	PodNamespace string
	PodName      string
	Container    string
	Resource     string
	DeviceIDs    []string
	Response     *pluginapi.ContainerAllocateResponse
	TraceID      string
	Allocated    time.Time
}
