package manager

import "time"

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
	Removed bool
	// AllocationsOnly: only the resource's allocations moved (Free and
	// Allocated), by an Allocate or a Release.
	AllocationsOnly bool
	Resource        ResourceInfo
	Revision        uint64
}

// WatchOptions say what a Watch subscriber is sent.
type WatchOptions struct {
	// OmitDeviceIDs: the snapshot's Changes carry no device IDs (their
	// counts stay), so that it holds less; live Changes carry them all.
	OmitDeviceIDs bool
	// OmitAllocationChanges: no AllocationsOnly Changes, so that a
	// subscriber that follows devices, health and endpoints is not woken
	// by every Allocate and Release.
	OmitAllocationChanges bool
}

// WithoutDeviceIDs returns c with no device IDs (Healthy, Unhealthy,
// Allocated); the counts stay.
func (c Change) WithoutDeviceIDs() Change {
	c.Resource.Healthy, c.Resource.Unhealthy, c.Resource.Allocated = nil, nil, nil
	return c
}

// changeOverhead is what a Change holds in a subscriber's queue besides its
// strings: the structs, the queue entry and the slice headers.
const changeOverhead = 512

// endpointOverhead is what one EndpointInfo holds besides its strings.
const endpointOverhead = 256

// stringOverhead is what one string of a slice holds besides its bytes.
const stringOverhead = 16

// size is the bytes c holds in a Watch subscriber's queue.
func (c Change) size() int {
	r := c.Resource
	n := changeOverhead + len(r.Name)
	for _, ids := range [][]string{r.Healthy, r.Unhealthy, r.Allocated} {
		for _, id := range ids {
			n += len(id) + stringOverhead
		}
	}
	for _, e := range r.Endpoints {
		n += endpointOverhead + len(e.Endpoint) + len(e.SocketPath) + len(e.Generation) + len(e.Path) + len(e.State)
		for _, v := range e.Versions {
			n += len(v) + stringOverhead
		}
	}
	return n
}
