package upstream

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// podResourcesMaxMsgSize is what the kubelet's own tests and agents pass
// to GetV1Client.
const podResourcesMaxMsgSize = 16 * 1024 * 1024

// podResourcesSocket is the kubelet's path of the socket beneath the root
// dir.
func (d *dm) podResourcesSocket() string {
	return filepath.Join(d.root, "pod-resources", "kubelet.sock")
}

// podResources connects to the devicemanager's pod resources socket as an
// agent does, with the kubelet's client helper.
func (d *dm) podResources() podresourcesv1.PodResourcesListerClient {
	d.t.Helper()
	sock := d.podResourcesSocket()
	client, conn, err := podresources.GetV1Client(context.Background(), "unix://"+sock, 10*time.Second, podResourcesMaxMsgSize)
	if err != nil {
		d.t.Fatalf("GetV1Client %s: %v", sock, err)
	}
	d.t.Cleanup(func() { _ = conn.Close() })
	return client
}

// topoDevice is a healthy Stub device on the given NUMA nodes.
func topoDevice(id string, numa ...int64) *pluginapi.Device {
	d := &pluginapi.Device{ID: id, Health: pluginapi.Healthy}
	if len(numa) > 0 {
		d.Topology = &pluginapi.TopologyInfo{}
		for _, n := range numa {
			d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: n})
		}
	}
	return d
}

// topoStub starts a Stub with the devices on <device-plugins>/<name>.sock
// and registers it on kubelet.sock.
func (d *dm) topoStub(name, resource string, devs []*pluginapi.Device) *plugin.Stub {
	d.t.Helper()
	s := plugin.NewDevicePluginStub(logger(), devs, filepath.Join(d.dpDir, name+".sock"), resource, false, false)
	s.SetAllocFunc(echoAlloc)
	if err := s.Start(klog.NewContext(context.Background(), logger())); err != nil {
		d.t.Fatalf("Stub Start: %v", err)
	}
	d.t.Cleanup(func() { _ = s.Stop(logger()) })
	if err := s.Register(klog.NewContext(context.Background(), logger()), d.kubeletSock(), resource, ""); err != nil {
		d.t.Fatalf("Stub Register: %v", err)
	}
	d.waitLive(resource, int64(countHealthy(devs)), nil)
	return s
}

func countHealthy(devs []*pluginapi.Device) int {
	n := 0
	for _, dv := range devs {
		if dv.Health == pluginapi.Healthy {
			n++
		}
	}
	return n
}

// containerDevices is one ContainerDevices of the kubelet's shape: one
// device, on one NUMA node (none when numa < 0).
func containerDevices(resource, id string, numa int64) *podresourcesv1.ContainerDevices {
	cd := &podresourcesv1.ContainerDevices{ResourceName: resource, DeviceIds: []string{id}}
	if numa >= 0 {
		cd.Topology = &podresourcesv1.TopologyInfo{Nodes: []*podresourcesv1.NUMANode{{ID: numa}}}
	}
	return cd
}

func protoDiff(want, got proto.Message) string {
	if proto.Equal(want, got) {
		return ""
	}
	return fmt.Sprintf("want: %s\ngot:  %s", prototext.Format(want), prototext.Format(got))
}

func allocateNamed(t *testing.T, d *dm, pod, namespace, name, container, resource string, count int64) *dmv1.AllocateResponse {
	t.Helper()
	resp, err := d.client.Allocate(ctxT(t), &dmv1.AllocateRequest{
		PodUid: pod, PodNamespace: namespace, PodName: name, ContainerName: container,
		Resources: []*dmv1.ResourceRequest{{ResourceName: resource, Count: count}},
	})
	if err != nil {
		t.Fatalf("Allocate %s/%s: %v", pod, container, err)
	}
	return resp
}

func listPods(t *testing.T, c podresourcesv1.PodResourcesListerClient) *podresourcesv1.ListPodResourcesResponse {
	t.Helper()
	resp, err := c.List(ctxT(t), &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return resp
}

// TestPodResourcesAllocateRestartRelease: through the kubelet's client
// helper, an allocation shows in List and Get with its pod's namespace and
// name, devices and topology as the plugin reported them; it is still
// listed after the devicemanager is SIGKILLed and restarted; after its
// release it is gone, and Get says so in the kubelet's words. The socket is
// where the kubelet's is beneath the root dir, mode 0600, owned by the
// service's user.
func TestPodResourcesAllocateRestartRelease(t *testing.T) {
	d := startDM(t)
	const res = "example.com/topo"
	d.topoStub("topo", res, []*pluginapi.Device{topoDevice("dev-1", 0), topoDevice("dev-2", 1), topoDevice("dev-3")})

	sock := d.podResourcesSocket()
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
		t.Fatalf("%s: mode %v, uid %d; want a socket, 0600, uid %d", sock, fi.Mode(), fi.Sys().(*syscall.Stat_t).Uid, os.Getuid())
	}

	c := d.podResources()
	if l := listPods(t, c); len(l.GetPodResources()) != 0 {
		t.Fatalf("List before any allocation: %v", l)
	}
	allocateNamed(t, d, "uid-1", "ml", "trainer-0", "worker", res, 2)
	allocateNamed(t, d, "uid-2", "", "", "c", res, 1)
	trainer := &podresourcesv1.PodResources{Namespace: "ml", Name: "trainer-0", Containers: []*podresourcesv1.ContainerResources{{
		Name: "worker", Devices: []*podresourcesv1.ContainerDevices{containerDevices(res, "dev-1", 0), containerDevices(res, "dev-2", 1)},
	}}}
	bare := &podresourcesv1.PodResources{Namespace: "", Name: "uid-2", Containers: []*podresourcesv1.ContainerResources{{
		Name: "c", Devices: []*podresourcesv1.ContainerDevices{containerDevices(res, "dev-3", -1)},
	}}}
	want := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{bare, trainer}}
	check := func(when string) {
		t.Helper()
		if diff := protoDiff(want, listPods(t, c)); diff != "" {
			t.Fatalf("List %s:\n%s", when, diff)
		}
		got, err := c.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "trainer-0"})
		if err != nil {
			t.Fatalf("Get %s: %v", when, err)
		}
		if diff := protoDiff(&podresourcesv1.GetPodResourcesResponse{PodResources: trainer}, got); diff != "" {
			t.Fatalf("Get %s:\n%s", when, diff)
		}
	}
	check("after the allocations")
	alloc, err := c.GetAllocatableResources(ctxT(t), &podresourcesv1.AllocatableResourcesRequest{})
	wantAlloc := &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
		containerDevices(res, "dev-1", 0), containerDevices(res, "dev-2", 1), containerDevices(res, "dev-3", -1),
	}}
	if err != nil || protoDiff(wantAlloc, alloc) != "" {
		t.Fatalf("GetAllocatableResources: %v\n%s", err, protoDiff(wantAlloc, alloc))
	}

	d.kill()
	d.start()
	// The agent's connection reconnects by itself; the restored state
	// answers before the plugin is live again.
	testutil.Eventually(t, "List after the restart", func() error {
		got, err := c.List(ctxT(t), &podresourcesv1.ListPodResourcesRequest{})
		if err != nil {
			return err
		}
		if diff := protoDiff(want, got); diff != "" {
			return fmt.Errorf("%s", diff)
		}
		return nil
	})
	check("after a SIGKILL and restart")

	if _, err := d.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "uid-1"}); err != nil {
		t.Fatal(err)
	}
	want.PodResources = want.PodResources[:1]
	if diff := protoDiff(want, listPods(t, c)); diff != "" {
		t.Fatalf("List after the release:\n%s", diff)
	}
	_, err = c.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodNamespace: "ml", PodName: "trainer-0"})
	if status.Code(err) != codes.Unknown || status.Convert(err).Message() != "pod trainer-0 in namespace ml not found" {
		t.Fatalf("Get of a released pod: %v; want the kubelet's plain not-found error", err)
	}
}

// TestPodResourcesUnhealthyLeavesAllocatable: a device the Stub reports
// unhealthy leaves GetAllocatableResources (the kubelet's allocatable
// devices are the healthy ones); healthy again, it is back.
func TestPodResourcesUnhealthyLeavesAllocatable(t *testing.T) {
	d := startDM(t)
	const res = "example.com/flaky"
	devs := []*pluginapi.Device{topoDevice("a", 0), topoDevice("b", 0), topoDevice("c", 1)}
	s := d.topoStub("flaky", res, devs)
	c := d.podResources()
	allocatable := func() *podresourcesv1.AllocatableResourcesResponse {
		t.Helper()
		resp, err := c.GetAllocatableResources(ctxT(t), &podresourcesv1.AllocatableResourcesRequest{})
		if err != nil {
			t.Fatalf("GetAllocatableResources: %v", err)
		}
		return resp
	}
	all := &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
		containerDevices(res, "a", 0), containerDevices(res, "b", 0), containerDevices(res, "c", 1),
	}}
	if diff := protoDiff(all, allocatable()); diff != "" {
		t.Fatalf("all healthy:\n%s", diff)
	}
	sick := []*pluginapi.Device{topoDevice("a", 0), {ID: "b", Health: pluginapi.Unhealthy, Topology: devs[1].Topology}, topoDevice("c", 1)}
	s.Update(sick)
	d.waitLive(res, 2, nil)
	want := &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
		containerDevices(res, "a", 0), containerDevices(res, "c", 1),
	}}
	if diff := protoDiff(want, allocatable()); diff != "" {
		t.Fatalf("b unhealthy:\n%s", diff)
	}
	s.Update(devs)
	d.waitLive(res, 3, nil)
	if diff := protoDiff(all, allocatable()); diff != "" {
		t.Fatalf("b healthy again:\n%s", diff)
	}
}

// TestPodResourcesGetNames: Get with an empty name, or with a name far
// beyond any pod's (64 KiB), is the kubelet's plain not-found error (the
// long one echoed cut short), and the service goes on answering.
func TestPodResourcesGetNames(t *testing.T) {
	d := startDM(t)
	c := d.podResources()
	long := strings.Repeat("x", 64<<10)
	for _, tc := range []struct {
		what, namespace, name, want string
	}{
		{"empty name", "default", "", "pod  in namespace default not found"},
		{"empty name and namespace", "", "", "pod  in namespace  not found"},
		{"oversized name", "default", long, `pod "` + long[:256] + `"… (65536 bytes) in namespace default not found`},
	} {
		_, err := c.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodNamespace: tc.namespace, PodName: tc.name})
		if status.Code(err) != codes.Unknown || status.Convert(err).Message() != tc.want {
			t.Fatalf("Get with an %s: %v\nwant code Unknown, %q", tc.what, err, tc.want)
		}
	}
	if l := listPods(t, c); len(l.GetPodResources()) != 0 {
		t.Fatalf("List: %v", l)
	}
}

// TestPodResourcesRateLimit: the kubelet's limit, 100 calls a second with
// a burst of 10, shared by every caller. Callers within it all succeed:
// two agents taking turns, each call at least 1/100 s after the previous
// one answered (so every token taken is back before the next call: the
// bucket never runs dry however slow the machine), then a burst of 10 into
// the full bucket. A burst far beyond it gets RESOURCE_EXHAUSTED for some
// of its calls, in the kubelet's words.
func TestPodResourcesRateLimit(t *testing.T) {
	d := startDM(t)
	agents := []podresourcesv1.PodResourcesListerClient{d.podResources(), d.podResources()}
	// Pacing is what this test is about: the limit's period plus a
	// margin, not a wait for a state.
	const gap = time.Second/podresources.DefaultQPS + 2*time.Millisecond
	for i := range 40 {
		c := agents[i%2]
		var err error
		switch i % 3 {
		case 0:
			_, err = c.List(ctxT(t), &podresourcesv1.ListPodResourcesRequest{})
		case 1:
			_, err = c.GetAllocatableResources(ctxT(t), &podresourcesv1.AllocatableResourcesRequest{})
		default:
			_, err = c.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodNamespace: "default", PodName: "none"})
			if status.Code(err) == codes.Unknown {
				err = nil // not found: the call was served
			}
		}
		if err != nil {
			t.Fatalf("paced call %d: %v", i, err)
		}
		<-time.After(gap)
	}
	burst := func(n int) []error {
		var wg sync.WaitGroup
		start := make(chan struct{})
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				<-start
				_, errs[i] = agents[i%2].List(ctxT(t), &podresourcesv1.ListPodResourcesRequest{})
			})
		}
		close(start)
		wg.Wait()
		return errs
	}
	for i, err := range burst(podresources.DefaultBurstTokens) {
		if err != nil {
			t.Fatalf("call %d of a burst of %d into the full bucket: %v", i, podresources.DefaultBurstTokens, err)
		}
	}
	// 200 calls at once take 1.9 s to be all allowed; should a slow
	// machine spread one burst that wide, the next is tried.
	testutil.WaitFor(t, "a burst refused in part", func() bool {
		refused := 0
		for _, err := range burst(20 * podresources.DefaultBurstTokens) {
			if err == nil {
				continue
			}
			if status.Code(err) != codes.ResourceExhausted || status.Convert(err).Message() != "rejected by rate limit" {
				t.Fatalf("a refused call: %v; want RESOURCE_EXHAUSTED \"rejected by rate limit\"", err)
			}
			refused++
		}
		return refused > 0
	})
}
