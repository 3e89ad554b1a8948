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

// ContainerKind is the part a container plays in its pod, which decides
// whether it shares devices with the pod's other containers, as the
// kubelet's device manager shares them (its Allocate and devicesToReuse):
// the devices of an init container that runs to its end are taken again
// by the containers allocated after it, first, before free devices.
type ContainerKind string

// Container kinds.
const (
	// KindApp is an app container, and any container whose kind was not
	// given. It keeps its devices: no other container takes them.
	KindApp ContainerKind = ""
	// KindInit is an init container that runs to its end before the next
	// container starts. The pod's init containers, sidecars and app
	// containers allocated after it take its devices again, first.
	KindInit ContainerKind = "init"
	// KindSidecar is a restartable init container (restartPolicy Always),
	// which runs beside the app containers. It takes a finished init
	// container's devices first too, and keeps them: no other container
	// takes them.
	KindSidecar ContainerKind = "sidecar"
)

// Valid reports whether k is one of the kinds above.
func (k ContainerKind) Valid() bool { return k == KindApp || k == KindInit || k == KindSidecar }

// Request asks for devices for one container.
type Request struct {
	PodUID    string
	Container string
	// Kind is the container's part in its pod. The container's first
	// Allocate fixes it: a repeated request is answered from the record,
	// whatever kind it names.
	Kind      ContainerKind
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
	// Kind is the container's kind, as its first Allocate fixed it.
	Kind ContainerKind
}

// Allocation is one container's devices of one resource, as listed.
type Allocation struct {
	PodUID       string
	PodNamespace string
	PodName      string
	Container    string
	// Kind is the container's part in its pod, as its Allocate gave it.
	// Devices of an init container may be listed for a later container of
	// the same pod too: they share them.
	Kind      ContainerKind
	Resource  string
	DeviceIDs []string
	Response  *pluginapi.ContainerAllocateResponse
	TraceID   string
	Allocated time.Time
}
