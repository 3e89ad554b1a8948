package podworker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// The pods' device-plugin resources are the devicemanager's: the worker
// asks it, over DeviceManagerService, to allocate a container's
// resources.limits as the kubelet's device manager allocates them, for
// what a container's start gets (StartContainer: the device plugins' and
// the claims' CDI devices), and to free them with the pod.

// Devices is what the worker asks of the device-plugin half.
type Devices interface {
	// Allocate allocates the container's device-plugin resources (name →
	// count). kind is the container's part in the pod (app, init or
	// sidecar): a container shares the devices of the init containers
	// allocated before it, as the kubelet's device manager reuses them.
	Allocate(ctx context.Context, pod *corev1.Pod, container string, kind dmv1.ContainerKind, resources map[string]int64) error
	// StartContainer returns the CDI devices the container is started
	// with: its device plugins' and its claims'.
	StartContainer(ctx context.Context, podUID, container string) ([]string, error)
	// Release frees the devices of the pod, and releases its claims.
	Release(ctx context.Context, podUID string) error
	// Resources are the names of the resources the node's device plugins
	// serve (registered, or within their grace period).
	Resources(ctx context.Context) (map[string]bool, error)
}

// ReasonAdmissionError is the kubelet's event reason when a pod's
// device-plugin resources cannot be allocated.
const ReasonAdmissionError = "UnexpectedAdmissionError"

// DRAExtendedResourcePrefix names a DRA extended resource of a device
// class (deviceclass.resource.kubernetes.io/<class>).
const DRAExtendedResourcePrefix = "deviceclass.resource.kubernetes.io/"

// devicePluginLimits are the container's limits the device plugins
// serve: neither the node's own (cpu, memory…) nor DRA's extended ones.
func devicePluginLimits(c corev1.Container) map[string]int64 {
	out := map[string]int64{}
	for name, q := range c.Resources.Limits {
		if native(name) || strings.HasPrefix(string(name), DRAExtendedResourcePrefix) {
			continue
		}
		out[string(name)] = q.Value()
	}
	return out
}

// hasDevicePluginLimits says whether a container of the pod has
// device-plugin resources.
func hasDevicePluginLimits(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			if len(devicePluginLimits(c)) > 0 {
				return true
			}
		}
	}
	return false
}

// allocateDevices allocates every container's device-plugin resources,
// init containers first, in their order, each with its kind: the devices
// of an init container that runs to its end are taken again by the
// containers after it, as the kubelet's device manager reuses them, so a
// node with just enough devices for the app containers takes a pod whose
// init containers ask for some too. Allocate is idempotent: a pod
// allocated before a restart gets the same devices.
func (w *Worker) allocateDevices(ctx context.Context, pod *corev1.Pod) error {
	for i, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			res := devicePluginLimits(c)
			if len(res) == 0 {
				continue
			}
			kind := dmv1.ContainerKind_CONTAINER_KIND_APP
			if i == 0 {
				kind = dmv1.ContainerKind_CONTAINER_KIND_INIT
				if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
					kind = dmv1.ContainerKind_CONTAINER_KIND_SIDECAR
				}
			}
			if err := w.cfg.Devices.Allocate(ctx, pod, c.Name, kind, res); err != nil {
				return fmt.Errorf("the device-plugin resources of container %s: %w", c.Name, err)
			}
		}
	}
	return nil
}

// grpcDevices is Devices over a connection to the devicemanager.
type grpcDevices struct {
	dm   dmv1.DeviceManagerServiceClient
	addr string
}

// NewDevices returns Devices over conn, a connection to the devicemanager
// at addr (named in errors).
func NewDevices(conn grpc.ClientConnInterface, addr string) Devices {
	return &grpcDevices{dm: dmv1.NewDeviceManagerServiceClient(conn), addr: addr}
}

func (d *grpcDevices) wrap(call string, err error) error {
	return fmt.Errorf("nodeplug-devicemanager at %s: %s: %w", d.addr, call, errdefs.FromGRPC(err))
}

func (d *grpcDevices) Allocate(ctx context.Context, pod *corev1.Pod, container string, kind dmv1.ContainerKind, resources map[string]int64) error {
	req := &dmv1.AllocateRequest{
		PodUid: string(pod.UID), ContainerName: container, ContainerKind: kind, PodNamespace: pod.Namespace, PodName: pod.Name,
	}
	for _, name := range slices.Sorted(maps.Keys(resources)) {
		req.Resources = append(req.Resources, &dmv1.ResourceRequest{ResourceName: name, Count: resources[name]})
	}
	if _, err := d.dm.Allocate(ctx, req); err != nil {
		return d.wrap("Allocate", err)
	}
	return nil
}

func (d *grpcDevices) StartContainer(ctx context.Context, podUID, container string) ([]string, error) {
	resp, err := d.dm.StartContainer(ctx, &dmv1.StartContainerRequest{PodUid: podUID, ContainerName: container})
	if err != nil {
		if err := errdefs.FromGRPC(err); errors.Is(err, errdefs.ErrNotFound) {
			// Neither devices nor prepared claims: nothing to inject.
			return nil, nil
		}
		return nil, d.wrap("StartContainer", err)
	}
	return resp.GetCdiDevices(), nil
}

func (d *grpcDevices) Release(ctx context.Context, podUID string) error {
	if _, err := d.dm.Release(ctx, &dmv1.ReleaseRequest{PodUid: podUID}); err != nil {
		return d.wrap("Release", err)
	}
	return nil
}
