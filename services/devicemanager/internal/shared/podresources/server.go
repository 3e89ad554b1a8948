// Package podresources serves the kubelet's pod resources API
// (k8s.io/kubelet/pkg/apis/podresources/v1: List, GetAllocatableResources
// and Get) from the devicemanager's state, so that monitoring agents built
// for a kubelet (GPU metrics exporters, topology and NUMA monitors) work
// unchanged. It is a gRPC adapter: it reads the allocations and the device
// sets through Source and converts them to the upstream types; it changes
// nothing.
//
// What it answers, as the kubelet does:
//   - a pod is every pod UID that holds an allocation, named by the
//     namespace and name its first Allocate gave; a pod known only by its
//     UID is listed under namespace "" with its UID as the name;
//   - a container lists its devices one ContainerDevices per device and
//     NUMA node of that device (one with no topology when the plugin gave
//     none), the kubelet's shape;
//   - the init containers that run to their end are left out (sidecars
//     stay), as the kubelet lists only a pod's restartable init containers
//     and app containers: a device an init container shared is listed
//     under each container that took it again;
//   - GetAllocatableResources lists the healthy devices of every resource,
//     in the same shape;
//   - a container's dynamic_resources are the prepared DRA claims it
//     references (WithClaims): per claim its name and namespace and per
//     device the driver, pool, device and CDI device IDs (only the devices
//     of the request it names, when it names one); a pod that holds only
//     claims is listed too;
//   - CPU and memory fields stay empty: nodeplug does not manage them;
//   - Get of an unknown pod is the kubelet's plain error
//     "pod <name> in namespace <namespace> not found" (code Unknown);
//   - calls are rate-limited (Limiter; server.RateLimit refuses them),
//     100 per second with a burst of 10, RESOURCE_EXHAUSTED beyond.
//
// Server is safe for concurrent use; every answer is built from one read of
// the allocations and one of the device sets.
package podresources

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
)

// Source is what the pod resources API reads: the allocations and the
// device sets with their health and topology. Its methods must be safe for
// concurrent use and return slices the caller owns. *manager.Manager is
// one.
type Source interface {
	// ListAllocations returns every allocation ("" for every pod).
	ListAllocations(pod string) []allocator.Allocation
	// ListDevices returns the device set of every resource.
	ListDevices() []manager.ResourceDevices
}

var _ Source = (*manager.Manager)(nil)

// apiVersion is the server_api_version label of the kubelet's metrics.
const apiVersion = "v1"

// Server implements podresourcesv1.PodResourcesListerServer.
type Server struct {
	podresourcesv1.UnimplementedPodResourcesListerServer
	src     Source
	claims  ClaimSource
	metrics *metrics
}

// ClaimSource is what the pod resources API reads of the prepared DRA
// claims, nodeplug-dramanager's (draclient.Client).
type ClaimSource interface {
	Pods(ctx context.Context) ([]*dmv1.PodClaims, error)
}

// WithClaims fills the containers' dynamic resources from c. It is called
// before serving.
func (s *Server) WithClaims(c ClaimSource) *Server {
	s.claims = c
	return s
}

// pods reads the allocations and the claims into pods.
// A failure to read the claims fails the call: a list without them would
// say that pods hold no dynamic resources.
func (s *Server) pods(ctx context.Context) ([]*pod, error) {
	var pcs []*dmv1.PodClaims
	if s.claims != nil {
		var err error
		if pcs, err = s.claims.Pods(ctx); err != nil {
			return nil, err
		}
	}
	return group(s.src.ListAllocations(""), pcs), nil
}

var _ podresourcesv1.PodResourcesListerServer = (*Server)(nil)

// New returns a server reading src. Its metrics, named as the kubelet's,
// go to reg (nil: none).
func New(src Source, reg prometheus.Registerer) *Server {
	return &Server{src: src, metrics: newMetrics(reg)}
}

// List returns every pod that holds devices, with its containers and their
// devices.
func (s *Server) List(ctx context.Context, _ *podresourcesv1.ListPodResourcesRequest) (*podresourcesv1.ListPodResourcesResponse, error) {
	s.metrics.requests(s.metrics.list)
	pods, err := s.pods(ctx)
	if err != nil {
		return nil, err
	}
	topo := topologies(s.src.ListDevices())
	resp := &podresourcesv1.ListPodResourcesResponse{PodResources: make([]*podresourcesv1.PodResources, 0, len(pods))}
	for _, p := range pods {
		resp.PodResources = append(resp.PodResources, p.toAPI(topo))
	}
	return resp, nil
}

// GetAllocatableResources returns the healthy devices of every resource,
// with their topology (the kubelet's GetAllocatableDevices).
func (s *Server) GetAllocatableResources(context.Context, *podresourcesv1.AllocatableResourcesRequest) (*podresourcesv1.AllocatableResourcesResponse, error) {
	s.metrics.requests(s.metrics.getAllocatable)
	resp := &podresourcesv1.AllocatableResourcesResponse{}
	for _, r := range s.src.ListDevices() {
		for _, d := range r.Devices {
			if d.Healthy {
				resp.Devices = appendDevice(resp.Devices, r.Name, d.ID, d.NUMANodes)
			}
		}
	}
	return resp, nil
}

// Get returns the pod named by namespace and name. When two pod UIDs carry
// the same name (a pod deleted and created again before the old one was
// released), the one allocated last is answered.
func (s *Server) Get(ctx context.Context, req *podresourcesv1.GetPodResourcesRequest) (*podresourcesv1.GetPodResourcesResponse, error) {
	s.metrics.requests(s.metrics.get)
	pods, err := s.pods(ctx)
	if err != nil {
		return nil, err
	}
	var found *pod
	for _, p := range pods {
		if p.namespace == req.GetPodNamespace() && p.name == req.GetPodName() && (found == nil || p.latest.After(found.latest)) {
			found = p
		}
	}
	if found == nil {
		s.metrics.getErrors.Inc()
		// The kubelet's words, a plain error (code Unknown).
		return nil, fmt.Errorf("pod %s in namespace %s not found", echo(req.GetPodName()), echo(req.GetPodNamespace()))
	}
	return &podresourcesv1.GetPodResourcesResponse{PodResources: found.toAPI(topologies(s.src.ListDevices()))}, nil
}

// echo returns a caller's value for an error message: as it is, as the
// kubelet echoes it, when it is short and printable; otherwise quoted and
// cut to bounds.MaxEcho bytes.
func echo(s string) string {
	if len(s) <= bounds.MaxEcho && utf8.ValidString(s) && !strings.ContainsFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) {
		return s
	}
	return bounds.Quote(s)
}

// pod is one pod UID's allocations, grouped.
type pod struct {
	uid, namespace, name string
	containers           []*container // sorted by name
	latest               time.Time    // its last allocation
}

type container struct {
	name    string
	allocs  []allocator.Allocation // sorted by resource
	dynamic []*dmv1.PreparedDevice // by claim
}

// group groups allocations and claims by pod UID and container. Pods are
// sorted by namespace, name and UID.
func group(allocs []allocator.Allocation, pcs []*dmv1.PodClaims) []*pod {
	byUID := map[string]*pod{}
	var pods []*pod
	for _, a := range allocs {
		if len(a.DeviceIDs) == 0 || a.Kind == allocator.KindInit {
			// The kubelet lists a pod's sidecars and app containers,
			// not the init containers that run to their end; the
			// devices those shared are listed under the containers
			// that took them again.
			continue
		}
		p := byUID[a.PodUID]
		if p == nil {
			p = &pod{uid: a.PodUID, namespace: a.PodNamespace, name: a.PodName}
			if p.name == "" {
				// Known only by its UID.
				p.namespace, p.name = "", a.PodUID
			}
			byUID[a.PodUID] = p
			pods = append(pods, p)
		}
		if a.Allocated.After(p.latest) {
			p.latest = a.Allocated
		}
		i, found := slices.BinarySearchFunc(p.containers, a.Container, func(c *container, name string) int { return cmp.Compare(c.name, name) })
		if !found {
			p.containers = slices.Insert(p.containers, i, &container{name: a.Container})
		}
		p.containers[i].allocs = append(p.containers[i].allocs, a)
	}
	for _, pc := range pcs {
		p := byUID[pc.GetPodUid()]
		if p == nil {
			p = &pod{uid: pc.GetPodUid(), namespace: pc.GetPodNamespace(), name: pc.GetPodName()}
			byUID[pc.GetPodUid()] = p
			pods = append(pods, p)
		}
		for _, cr := range pc.GetContainers() {
			i, found := slices.BinarySearchFunc(p.containers, cr.GetName(), func(c *container, name string) int { return cmp.Compare(c.name, name) })
			if !found {
				p.containers = slices.Insert(p.containers, i, &container{name: cr.GetName()})
			}
			p.containers[i].dynamic = append(p.containers[i].dynamic, cr.GetDevices()...)
		}
	}
	slices.SortFunc(pods, func(a, b *pod) int {
		return cmp.Or(cmp.Compare(a.namespace, b.namespace), cmp.Compare(a.name, b.name), cmp.Compare(a.uid, b.uid))
	})
	for _, p := range pods {
		for _, c := range p.containers {
			slices.SortFunc(c.allocs, func(a, b allocator.Allocation) int { return cmp.Compare(a.Resource, b.Resource) })
		}
	}
	return pods
}

// topology maps resource → device ID → NUMA nodes.
type topology map[string]map[string][]int64

func topologies(rs []manager.ResourceDevices) topology {
	t := make(topology, len(rs))
	for _, r := range rs {
		m := make(map[string][]int64, len(r.Devices))
		for _, d := range r.Devices {
			if len(d.NUMANodes) > 0 {
				m[d.ID] = d.NUMANodes
			}
		}
		t[r.Name] = m
	}
	return t
}

func (p *pod) toAPI(topo topology) *podresourcesv1.PodResources {
	out := &podresourcesv1.PodResources{
		Name: p.name, Namespace: p.namespace,
		Containers: make([]*podresourcesv1.ContainerResources, 0, len(p.containers)),
	}
	for _, c := range p.containers {
		cr := &podresourcesv1.ContainerResources{Name: c.name}
		for _, a := range c.allocs {
			for _, id := range slices.Sorted(slices.Values(a.DeviceIDs)) {
				// A device the plugin no longer reports has no topology.
				cr.Devices = appendDevice(cr.Devices, a.Resource, id, topo[a.Resource][id])
			}
		}
		cr.DynamicResources = dynamicToAPI(c.dynamic)
		out.Containers = append(out.Containers, cr)
	}
	return out
}

// appendDevice appends one device in the kubelet's shape: one entry per
// NUMA node of the device, or one without topology when it has none
// (numa nil). A topology without nodes gives no entry, as the kubelet's
// loop over the topology's nodes gives none (containerDevicesFromResourceDeviceInstances).
func appendDevice(out []*podresourcesv1.ContainerDevices, resource, id string, numa []int64) []*podresourcesv1.ContainerDevices {
	if numa == nil {
		return append(out, &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}})
	}
	for _, n := range numa {
		out = append(out, &podresourcesv1.ContainerDevices{
			ResourceName: resource, DeviceIds: []string{id},
			Topology: &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: n}}},
		})
	}
	return out
}

// dynamicToAPI converts a container's claim devices, grouped by claim
// (they arrive sorted by claim), as the kubelet's GetDynamicResources
// does.
func dynamicToAPI(devs []*dmv1.PreparedDevice) []*podresourcesv1.DynamicResource {
	var out []*podresourcesv1.DynamicResource
	for _, d := range devs {
		if n := len(out); n == 0 || out[n-1].ClaimName != d.GetClaimName() || out[n-1].ClaimNamespace != d.GetClaimNamespace() {
			out = append(out, &podresourcesv1.DynamicResource{ClaimName: d.GetClaimName(), ClaimNamespace: d.GetClaimNamespace()})
		}
		cdi := make([]*podresourcesv1.CDIDevice, 0, len(d.GetCdiDeviceIds()))
		for _, id := range d.GetCdiDeviceIds() {
			cdi = append(cdi, &podresourcesv1.CDIDevice{Name: id})
		}
		last := out[len(out)-1]
		last.ClaimResources = append(last.ClaimResources, &podresourcesv1.ClaimResource{
			CdiDevices: cdi, DriverName: d.GetDriver(), PoolName: d.GetPool(), DeviceName: d.GetDevice()})
	}
	return out
}
