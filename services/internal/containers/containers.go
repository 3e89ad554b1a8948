// Package containers runs a pod's containers through a container runtime:
// the images they need, the containers themselves, their states, and
// their stopping and removal. Runtime is what the pod worker asks of a
// runtime; Podman is one, driving podman's command line, and Docker
// another, driving docker's.
package containers

import (
	"context"
	"errors"
	"time"
)

// The image pull policies (corev1.PullPolicy's values, as strings).
const (
	PullAlways       = "Always"
	PullIfNotPresent = "IfNotPresent"
	PullNever        = "Never"
)

// Errors a Runtime returns, wrapped with the details.
var (
	// ErrImageNeverPull: the image is not present and the pull policy is
	// Never (the kubelet's reason ErrImageNeverPull).
	ErrImageNeverPull = errors.New("image not present with pull policy of Never")
	// ErrImagePull: pulling the image failed (the kubelet's reason
	// ErrImagePull).
	ErrImagePull = errors.New("image pull failed")
	// ErrNotFound: the runtime has no such container.
	ErrNotFound = errors.New("no such container")
)

// Spec is a container to run.
type Spec struct {
	Name   string // the runtime's container name
	Labels map[string]string
	Image  string
	// PullPolicy is "Always", "IfNotPresent" or "Never" (corev1.PullPolicy
	// values, as strings).
	PullPolicy string
	// Command overrides the image's ENTRYPOINT when non-empty (Kubernetes'
	// command); the image's CMD is then not used, Args replacing it.
	Command []string
	// Args overrides the image's CMD when non-empty (Kubernetes' args).
	Args       []string
	WorkingDir string
	// Env is the container's environment, KEY=VALUE, in order; a later
	// entry for a key wins.
	Env []string
	// CDIDevices are fully qualified CDI device names
	// (vendor.com/class=name).
	CDIDevices  []string
	Devices     []Device // host devices
	Mounts      []Mount  // bind mounts
	Annotations map[string]string
	// LogPath is the file the runtime writes the container's output to,
	// in the CRI log format, or a link to the runtime's own log (docker's
	// json-file); package podlogs reads both. Its directory is created
	// when missing. Empty: the runtime's own logging.
	LogPath string
}

// Device is a host device made available in the container.
type Device struct {
	HostPath      string
	ContainerPath string // empty: HostPath
	Permissions   string // cgroup permissions, of "rwm"; empty: "rwm"
}

// Mount is a host file or directory bind mounted into the container.
type Mount struct {
	HostPath      string
	ContainerPath string
	ReadOnly      bool
}

// Status is where a container is in its life.
type Status string

// The statuses of a container.
const (
	StatusCreated Status = "created" // created, not started yet
	StatusRunning Status = "running"
	StatusExited  Status = "exited"
	StatusUnknown Status = "unknown"
)

// State is what a runtime says of one of its containers.
type State struct {
	ID     string
	Name   string
	Labels map[string]string
	Status Status
	// ExitCode is the container's exit code once it has exited.
	ExitCode int
	// StartedAt and FinishedAt are zero while the container has not
	// started, or not finished.
	StartedAt, FinishedAt time.Time
}

// Runtime runs containers.
type Runtime interface {
	// Name is the runtime and its version, such as "podman 4.3.1".
	Name() string
	// EnsureImage makes sure the image is present as the pull policy
	// says, pulling it when needed.
	EnsureImage(ctx context.Context, image, pullPolicy string) error
	// Run creates the container and starts it, detached, and returns its
	// ID. The image must be present (EnsureImage). When it fails no
	// container is left behind.
	Run(ctx context.Context, s Spec) (id string, err error)
	// List is every container, running or not, that carries the label
	// key.
	List(ctx context.Context, label string) ([]State, error)
	// Stop stops the container: SIGTERM (or the image's stop signal),
	// then SIGKILL when it is still running after grace.
	Stop(ctx context.Context, id string, grace time.Duration) error
	// Remove removes the container, killing it when it runs. A container
	// already gone is not an error.
	Remove(ctx context.Context, id string) error
}
