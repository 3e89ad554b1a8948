package podresources

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/server"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	t.Cleanup(cancel)
	return ctx
}

// env is a real manager with real device plugins, its pod resources API
// served on a real Unix socket as main.go serves it (rate limit included).
type env struct {
	t      *testing.T
	root   string
	m      *manager.Manager
	pr     *Server
	conn   *grpc.ClientConn
	client podresourcesv1.PodResourcesListerClient
}

func newEnv(t *testing.T) *env {
	t.Helper()
	root := testutil.TempDir(t)
	dpDir := filepath.Join(root, "device-plugins")
	m, err := manager.Open(ctxT(t), manager.Config{
		DevicePluginsDir: dpDir, AllowedDirs: []string{root}, Store: store.New(dpDir, store.Options{}), Log: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	e := &env{t: t, root: root, m: m, pr: New(m, prometheus.NewRegistry())}
	lis, err := unixsock.Listen(filepath.Join(root, "pod-resources", "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	s, _ := rpcutil.NewServer(slog.New(slog.DiscardHandler), server.RateLimit(e.pr.Limiter(DefaultQPS, DefaultBurst).Allow))
	podresourcesv1.RegisterPodResourcesListerServer(s, e.pr)
	served := make(chan struct{})
	go func() { defer close(served); _ = s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(); <-served })
	if e.conn, err = rpcutil.DialPeer(lis.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.conn.Close() })
	e.client = podresourcesv1.NewPodResourcesListerClient(e.conn)
	return e
}

// plugin starts a device plugin and registers it as the reconciler would,
// then waits for its devices.
func (e *env) plugin(resource string, ids []string, numa map[string][]int64) *sampleplugin.Plugin {
	e.t.Helper()
	sock := filepath.Join(e.root, "plugins_registry", strings.ReplaceAll(resource, "/", "_")+".sock")
	p := plugintest.Start(e.t, sampleplugin.Options{Resource: resource, DeviceIDs: ids, NUMANodes: numa, SocketPath: sock})
	if err := e.m.Register(ctxT(e.t), manager.Registration{
		Resource: resource, Endpoint: sock, Versions: []string{"v1beta1"}, SocketPath: sock, Generation: "g1", Path: manager.PathPluginsRegistry,
	}); err != nil {
		e.t.Fatal(err)
	}
	e.waitAllocatable(resource, len(ids))
	return p
}

func (e *env) waitAllocatable(resource string, n int) {
	e.t.Helper()
	testutil.Eventually(e.t, fmt.Sprintf("%s: %d allocatable", resource, n), func() error {
		for _, r := range e.m.ListResources() {
			if r.Name == resource && r.Allocatable == int64(n) {
				return nil
			}
		}
		return fmt.Errorf("resources %+v", e.m.ListResources())
	})
}

func (e *env) allocate(pod, namespace, name, container string, reqs ...allocator.ResourceRequest) {
	e.t.Helper()
	if _, err := e.m.Allocate(ctxT(e.t), &allocator.Request{
		PodUID: pod, PodNamespace: namespace, PodName: name, Container: container, Resources: reqs,
	}); err != nil {
		e.t.Fatalf("Allocate %s/%s: %v", pod, container, err)
	}
}

func (e *env) list() *podresourcesv1.ListPodResourcesResponse {
	e.t.Helper()
	resp, err := e.client.List(ctxT(e.t), &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		e.t.Fatalf("List: %v", err)
	}
	return resp
}

func (e *env) allocatable() *podresourcesv1.AllocatableResourcesResponse {
	e.t.Helper()
	resp, err := e.client.GetAllocatableResources(ctxT(e.t), &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		e.t.Fatalf("GetAllocatableResources: %v", err)
	}
	return resp
}

// dev is one ContainerDevices: a device on the given NUMA node, or with no
// topology when numa < 0.
func dev(resource, id string, numa int64) *podresourcesv1.ContainerDevices {
	d := &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}}
	if numa >= 0 {
		d.Topology = &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: numa}}}
	}
	return d
}

// diff is "" when want and got are equal, else both in text form.
func diff(want, got proto.Message) string {
	if proto.Equal(want, got) {
		return ""
	}
	return fmt.Sprintf("want: %s\ngot:  %s", prototext.Format(want), prototext.Format(got))
}

const (
	gpu = "example.com/gpu"
	nic = "example.com/nic"
)

// TestPodResources: List names each pod by its Allocate's namespace and
// name (by UID under namespace "" when it had none), with its containers
// and their devices, one entry per device and NUMA node as the kubelet
// gives them; Get answers one pod; GetAllocatableResources lists the
// healthy devices only; a release takes the pod away.
func TestPodResources(t *testing.T) {
	e := newEnv(t)
	p := e.plugin(gpu, []string{"gpu-0", "gpu-1", "gpu-2", "gpu-3"}, map[string][]int64{
		"gpu-0": {0}, "gpu-1": {0}, "gpu-2": {1}, "gpu-3": {0, 1},
	})
	e.plugin(nic, []string{"nic-0", "nic-1"}, nil)

	if l := e.list(); len(l.GetPodResources()) != 0 {
		t.Fatalf("List with nothing allocated: %v", l)
	}
	e.allocate("uid-web", "default", "web-0", "main", allocator.ResourceRequest{Name: gpu, Count: 2})
	e.allocate("uid-web", "default", "web-0", "sidecar", allocator.ResourceRequest{Name: nic, Count: 1}, allocator.ResourceRequest{Name: gpu, Count: 1})
	e.allocate("uid-bare", "", "", "c", allocator.ResourceRequest{Name: gpu, Count: 1})

	web := &podresourcesv1.PodResources{Namespace: "default", Name: "web-0", Containers: []*podresourcesv1.ContainerResources{
		{Name: "main", Devices: []*podresourcesv1.ContainerDevices{dev(gpu, "gpu-0", 0), dev(gpu, "gpu-1", 0)}},
		{Name: "sidecar", Devices: []*podresourcesv1.ContainerDevices{dev(gpu, "gpu-2", 1), dev(nic, "nic-0", -1)}},
	}}
	bare := &podresourcesv1.PodResources{Namespace: "", Name: "uid-bare", Containers: []*podresourcesv1.ContainerResources{
		{Name: "c", Devices: []*podresourcesv1.ContainerDevices{dev(gpu, "gpu-3", 0), dev(gpu, "gpu-3", 1)}},
	}}
	want := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{bare, web}}
	if d := diff(want, e.list()); d != "" {
		t.Fatalf("List \n%s", d)
	}
	for _, tc := range []struct {
		namespace, name string
		want            *podresourcesv1.PodResources
	}{
		{"default", "web-0", web},
		{"", "uid-bare", bare},
	} {
		got, err := e.client.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodNamespace: tc.namespace, PodName: tc.name})
		if err != nil {
			t.Fatalf("Get %q/%q: %v", tc.namespace, tc.name, err)
		}
		if d := diff(&podresourcesv1.GetPodResourcesResponse{PodResources: tc.want}, got); d != "" {
			t.Fatalf("Get %q/%q \n%s", tc.namespace, tc.name, d)
		}
	}

	allDevices := []*podresourcesv1.ContainerDevices{
		dev(gpu, "gpu-0", 0), dev(gpu, "gpu-1", 0), dev(gpu, "gpu-2", 1), dev(gpu, "gpu-3", 0), dev(gpu, "gpu-3", 1),
		dev(nic, "nic-0", -1), dev(nic, "nic-1", -1),
	}
	if d := diff(&podresourcesv1.AllocatableResourcesResponse{Devices: allDevices}, e.allocatable()); d != "" {
		t.Fatalf("GetAllocatableResources \n%s", d)
	}

	// An unhealthy device leaves allocatable (allocated or not); the pod
	// holding it still lists it.
	for _, id := range []string{"gpu-1", "gpu-2"} {
		if err := p.SetHealth(id, false); err != nil {
			t.Fatal(err)
		}
	}
	e.waitAllocatable(gpu, 2)
	want2 := &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
		dev(gpu, "gpu-0", 0), dev(gpu, "gpu-3", 0), dev(gpu, "gpu-3", 1), dev(nic, "nic-0", -1), dev(nic, "nic-1", -1),
	}}
	if d := diff(want2, e.allocatable()); d != "" {
		t.Fatalf("GetAllocatableResources with gpu-1 and gpu-2 unhealthy \n%s", d)
	}
	if d := diff(want, e.list()); d != "" {
		t.Fatalf("List with unhealthy devices \n%s", d)
	}

	// A release takes the pod away; another container's release only that
	// container.
	if _, err := e.m.Release(ctxT(t), "uid-bare", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := e.m.Release(ctxT(t), "uid-web", "sidecar"); err != nil {
		t.Fatal(err)
	}
	web.Containers = web.Containers[:1]
	if d := diff(&podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{web}}, e.list()); d != "" {
		t.Fatalf("List after the releases \n%s", d)
	}
	_, err := e.client.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodName: "uid-bare"})
	if status.Code(err) != codes.Unknown || status.Convert(err).Message() != "pod uid-bare in namespace  not found" {
		t.Fatalf("Get of a released pod: %v", err)
	}
	// The kubelet's metrics: every call that reached the server, and the
	// failed Get.
	m := e.pr.metrics
	for _, c := range []struct {
		name string
		c    prometheus.Counter
		want float64
	}{
		{"requests_total", m.total, 9}, {"requests_list", m.list, 4}, {"requests_get", m.get, 3},
		{"requests_get_allocatable", m.getAllocatable, 2}, {"errors_get", m.getErrors, 1}, {"rejected", m.rejected, 0},
	} {
		if got := value(t, c.c); got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
}

func value(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestGetUnknownPod: Get of a pod that holds nothing — by an empty, an
// ordinary, an unprintable or an oversized name — is the kubelet's plain
// error (code Unknown); a long or unprintable value is echoed quoted and cut
// to bounds.MaxEcho bytes.
func TestGetUnknownPod(t *testing.T) {
	e := newEnv(t)
	e.plugin(gpu, []string{"gpu-0"}, nil)
	e.allocate("uid-1", "default", "web-0", "c", allocator.ResourceRequest{Name: gpu, Count: 1})
	long := strings.Repeat("n", 100<<10)
	tests := []struct {
		name, namespace, pod string
		want                 string
	}{
		{"empty name and namespace", "", "", "pod  in namespace  not found"},
		{"empty name", "default", "", "pod  in namespace default not found"},
		{"other namespace", "prod", "web-0", "pod web-0 in namespace prod not found"},
		{"UID of a named pod", "", "uid-1", "pod uid-1 in namespace  not found"},
		{"253 bytes", "default", strings.Repeat("a", 253), "pod " + strings.Repeat("a", 253) + " in namespace default not found"},
		{"unprintable", "default", "web\n0", `pod "web\n0" in namespace default not found`},
		{"oversized", "default", long, `pod "` + long[:256] + `"… (102400 bytes) in namespace default not found`},
		{"oversized namespace", long, "web-0", `pod web-0 in namespace "` + long[:256] + `"… (102400 bytes) not found`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodNamespace: tc.namespace, PodName: tc.pod})
			if status.Code(err) != codes.Unknown || status.Convert(err).Message() != tc.want {
				t.Fatalf("Get: %v\nwant code Unknown, message %q", err, tc.want)
			}
		})
	}
	if got := value(t, e.pr.metrics.getErrors); got != float64(len(tests)) {
		t.Fatalf("errors_get = %v, want %d", got, len(tests))
	}
	// The pod itself is still there.
	if _, err := e.client.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodNamespace: "default", PodName: "web-0"}); err != nil {
		t.Fatalf("Get default/web-0: %v", err)
	}
}

// TestGetNameReused: when a pod was deleted and created again under the
// same name before the old one was released, Get answers the one
// allocated last, and List shows both.
func TestGetNameReused(t *testing.T) {
	e := newEnv(t)
	e.plugin(gpu, []string{"gpu-0", "gpu-1"}, nil)
	e.allocate("uid-old", "default", "web-0", "c", allocator.ResourceRequest{Name: gpu, Count: 1})
	e.allocate("uid-new", "default", "web-0", "c", allocator.ResourceRequest{Name: gpu, Count: 1})
	got, err := e.client.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodNamespace: "default", PodName: "web-0"})
	if err != nil {
		t.Fatal(err)
	}
	if ids := got.GetPodResources().GetContainers()[0].GetDevices()[0].GetDeviceIds(); len(ids) != 1 || ids[0] != "gpu-1" {
		t.Fatalf("Get answered %v, want the pod allocated last (gpu-1)", got)
	}
	if n := len(e.list().GetPodResources()); n != 2 {
		t.Fatalf("List shows %d pods, want 2", n)
	}
}

// A device whose topology has no NUMA nodes (Intel's GPU plugin sends
// such) gives GetAllocatableResources no entry, as the kubelet's loop over
// the topology's nodes gives none; a device without topology gives one
// entry without topology.
func TestAllocatableTopologyWithoutNodes(t *testing.T) {
	e := newEnv(t)
	e.plugin(gpu, []string{"gpu-0", "gpu-1", "gpu-2"}, map[string][]int64{"gpu-0": {}, "gpu-1": {1}})
	want := &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
		dev(gpu, "gpu-1", 1), dev(gpu, "gpu-2", -1),
	}}
	if d := diff(want, e.allocatable()); d != "" {
		t.Fatalf("GetAllocatableResources \n%s", d)
	}
}

// TestInitContainersLeftOut: as the kubelet lists a pod's sidecars and
// app containers only, an init container that runs to its end is left
// out; the devices it shared are listed under the app container that took
// them again, and the sidecar's under the sidecar.
func TestInitContainersLeftOut(t *testing.T) {
	e := newEnv(t)
	e.plugin(gpu, []string{"g0", "g1"}, nil)
	for _, c := range []struct {
		name  string
		kind  allocator.ContainerKind
		count int64
	}{{"init", allocator.KindInit, 2}, {"sidecar", allocator.KindSidecar, 1}, {"app", allocator.KindApp, 1}} {
		if _, err := e.m.Allocate(ctxT(t), &allocator.Request{
			PodUID: "uid-1", PodNamespace: "ns", PodName: "web", Container: c.name, Kind: c.kind,
			Resources: []allocator.ResourceRequest{{Name: gpu, Count: c.count}},
		}); err != nil {
			t.Fatalf("Allocate %s: %v", c.name, err)
		}
	}
	want := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{{
		Name: "web", Namespace: "ns", Containers: []*podresourcesv1.ContainerResources{
			{Name: "app", Devices: []*podresourcesv1.ContainerDevices{dev(gpu, "g1", -1)}},
			{Name: "sidecar", Devices: []*podresourcesv1.ContainerDevices{dev(gpu, "g0", -1)}},
		},
	}}}
	if d := diff(want, e.list()); d != "" {
		t.Fatal(d)
	}
}
