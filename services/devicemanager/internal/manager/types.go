package manager

import (
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// RegistrationPath says how an endpoint reached the manager.
type RegistrationPath string

// Registration paths.
const (
	// PathPluginsRegistry: RegisterPlugin from the reconciler, for a plugin
	// found in plugins_registry.
	PathPluginsRegistry RegistrationPath = "plugins_registry"
	// PathKubeletSock: v1beta1 Registration/Register on kubelet.sock.
	PathKubeletSock RegistrationPath = "kubelet_sock"
)

// EndpointState is the connection state of an endpoint.
type EndpointState string

// Endpoint states.
const (
	// StateConnecting: the stream is open, its first update not yet in.
	StateConnecting EndpointState = "connecting"
	// StateLive: the stream is open and has delivered devices.
	StateLive EndpointState = "live"
	// StateStopped: the stream ended; kept until the grace period ends.
	StateStopped EndpointState = "stopped"
)

// Registration is one request to connect a device plugin endpoint.
type Registration struct {
	Resource string
	// Endpoint is the absolute path of the plugin's socket.
	Endpoint string
	Versions []string
	// SocketPath is the registration socket (plugins_registry); for the
	// legacy path it is the endpoint itself.
	SocketPath string
	// Generation of the registration socket; empty means the endpoint
	// socket's own identity.
	Generation string
	Path       RegistrationPath
}

// EndpointInfo describes one endpoint of a resource.
type EndpointInfo struct {
	Endpoint            string
	SocketPath          string
	Generation          string
	Path                RegistrationPath
	State               EndpointState
	Versions            []string
	PreStartRequired    bool
	PreferredAllocation bool
	// Primary: the endpoint Allocate calls go to (the newest live one).
	Primary    bool
	Registered time.Time
	Stopped    time.Time // zero unless stopped
}

// ResourceInfo describes one resource and its device set.
type ResourceInfo struct {
	Name string
	// Capacity counts all devices, Allocatable the healthy ones, Free the
	// healthy ones not allocated.
	Capacity, Allocatable, Free int64
	Healthy, Unhealthy          []string // sorted
	Allocated                   []string // sorted
	Endpoints                   []EndpointInfo
	// GraceDeadline is when the resource goes if no endpoint comes back;
	// zero while an endpoint is live.
	GraceDeadline time.Time
}

// Change is one item of the Watch stream.
type Change struct {
	// Removed: the resource went (Resource is its last state).
	Removed  bool
	Resource ResourceInfo
	Revision uint64
}

// AllocateRequest asks for devices for one container.
type AllocateRequest struct {
	PodUID    string
	Container string
	Resources []ResourceRequest
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
}

// Allocation is one container's devices of one resource, as listed.
type Allocation struct {
	PodUID    string
	Container string
	Resource  string
	DeviceIDs []string
	Response  *pluginapi.ContainerAllocateResponse
	TraceID   string
	Allocated time.Time
}
