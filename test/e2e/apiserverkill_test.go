package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// The device plugin's resource and the DRA driver of the apiserver kill test.
const (
	killResource = "example.com/killdp"
	killDriver   = "gpu.kill.nodeplug.test"
)

// TestAPIServerKillLeavesDevicePluginsServing runs the whole stack with a
// device plugin and a DRA driver registered, and SIGKILLs nodeplug-apiserver
// while allocations, container starts, pod resources Lists and releases run
// one pod after another: they go on without an error while it is down, and
// so does the start of a container whose DRA claim was prepared before. A
// DRA prepare while it is down fails with an error that names the resource
// API, not the dramanager; once nodeplug-apiserver is started again, the
// same prepare succeeds, from the same dramanager process, and neither
// manager was restarted.
func TestAPIServerKillLeavesDevicePluginsServing(t *testing.T) {
	e := newEnv(t)
	e.plugin("killdp", killResource, 8, false)
	e.waitAllocatable(killResource, 8)
	dra := e.draClient()
	claims := startKillDriver(t, e, dra, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := dra.PrepareResources(ctx, claimPrepare("dra-pod-0", claims[0])); err != nil {
		t.Fatalf("PrepareResources with nodeplug-apiserver up: %v", err)
	}
	dm, drm := e.st.Process("devicemanager"), e.st.Process("dramanager")

	loop := startServingLoop(t, e, "dra-pod-0")
	loop.waitRounds(t, 3)
	e.st.Kill("apiserver")
	killedAt := loop.rounds.Load()
	loop.waitRounds(t, killedAt+5)

	_, err := dra.PrepareResources(ctx, claimPrepare("dra-pod-1", claims[1]))
	msg := status.Convert(err).Message()
	if err == nil {
		t.Fatal("PrepareResources succeeded with nodeplug-apiserver down")
	}
	if !strings.Contains(msg, "nodeplug-apiserver") && !strings.Contains(msg, "resource API") {
		t.Errorf("PrepareResources with nodeplug-apiserver down: %v; want an error naming nodeplug-apiserver or the resource API", err)
	}
	if strings.Contains(msg, "dramanager") {
		t.Errorf("PrepareResources with nodeplug-apiserver down: %v; the dramanager is not what is down", err)
	}
	loop.waitRounds(t, loop.rounds.Load()+5)
	t.Logf("with nodeplug-apiserver down: %d rounds served; the prepare failed with %v", loop.rounds.Load()-killedAt, err)

	if err := e.st.Start(ctx, "apiserver"); err != nil {
		t.Fatal(err)
	}
	var resp *dmv1.PrepareResourcesResponse
	testutil.Eventually(t, "PrepareResources after nodeplug-apiserver's restart", func() error {
		resp, err = dra.PrepareResources(ctx, claimPrepare("dra-pod-1", claims[1]))
		return err
	})
	if devs := containerDevices(resp, "main"); len(devs) != 1 || devs[0].GetDriver() != killDriver || devs[0].GetClaimUid() != string(claims[1].UID) {
		t.Errorf("container main after the restart got %v, want one device of %s for claim %s", devs, killDriver, claims[1].UID)
	}
	loop.waitRounds(t, loop.rounds.Load()+3)
	loop.stop(t)
	for name, p := range map[string]*stack.Process{"devicemanager": dm, "dramanager": drm} {
		if got := e.st.Process(name); got != p || got.Cmd.Process.Signal(syscall.Signal(0)) != nil {
			t.Errorf("the %s was restarted or exited (%v)", name, got.Err())
		}
	}
}

// draClient is a DRAService client on the dramanager's socket.
func (e *env) draClient() dmv1.DRAServiceClient {
	e.t.Helper()
	conn, err := rpcutil.DialPeer(e.st.Addr("dramanager"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = conn.Close() })
	return dmv1.NewDRAServiceClient(conn)
}

// claimPrepare is a PrepareResources request for pod uid in namespace
// default whose container "main" uses the claim.
func claimPrepare(uid string, claim *resourcev1.ResourceClaim) *dmv1.PrepareResourcesRequest {
	return &dmv1.PrepareResourcesRequest{
		PodUid: uid, PodNamespace: claim.Namespace, PodName: uid,
		PodClaims:  []*dmv1.PodClaim{{Name: "gpus", ResourceClaimName: claim.Name}},
		Containers: []*dmv1.ContainerClaims{{Name: "main", Claims: []*dmv1.ContainerClaim{{Name: "gpus"}}}},
	}
}

// containerDevices is what a PrepareResources answer gives the named
// container.
func containerDevices(resp *dmv1.PrepareResourcesResponse, name string) []*dmv1.PreparedDevice {
	for _, c := range resp.GetContainers() {
		if c.GetName() == name {
			return c.GetDevices()
		}
	}
	return nil
}

// kubeClient is a clientset for a kubeconfig nodeplug-apiserver wrote.
func kubeClient(t *testing.T, file string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", file)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", file, err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// startKillDriver starts killDriver on the upstream kubeletplugin helper in
// this process, with the drivers' kubeconfig, registering through
// plugins_registry/ and publishing four devices; it waits until the
// devicemanager serves it and sees its devices, and returns n claims of one
// device each, created with the operator's kubeconfig.
func startKillDriver(t *testing.T, e *env, dra dmv1.DRAServiceClient, n int) []*resourcev1.ResourceClaim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	node := nodeName(t, e.root)
	dataDir := filepath.Join(e.root, "plugins", killDriver)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	// The helper runs until Stop, not until ctx ends.
	helper, err := kubeletplugin.Start(context.Background(), preparingDriver{}, kubeletplugin.DriverName(killDriver), kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(kubeClient(t, layout.KubeconfigFile(e.root))),
		kubeletplugin.RegistrarDirectoryPath(layout.PluginsRegistryDir(e.root)), kubeletplugin.PluginDataDirectoryPath(dataDir))
	if err != nil {
		t.Fatalf("start the DRA driver %s: %v", killDriver, err)
	}
	t.Cleanup(helper.Stop)
	devs := make([]resourcev1.Device, 4)
	for i := range devs {
		devs[i] = resourcev1.Device{Name: fmt.Sprintf("gpu-%d", i)}
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{node: {Slices: []resourceslice.Slice{{Devices: devs}}}},
	}); err != nil {
		t.Fatalf("publish the devices of %s: %v", killDriver, err)
	}
	testutil.Eventually(t, killDriver+" served with its devices", func() error {
		drivers, err := dra.ListDRADrivers(ctx, &dmv1.ListDRADriversRequest{DriverName: killDriver})
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(drivers.GetDrivers(), func(d *dmv1.DRADriver) bool {
			return slices.ContainsFunc(d.GetInstances(), func(in *dmv1.DRADriverInstance) bool { return in.GetServing() && in.GetConnected() })
		}) {
			return fmt.Errorf("no connected instance serving: %v", drivers.GetDrivers())
		}
		list, err := dra.ListResourceSlices(ctx, &dmv1.ListResourceSlicesRequest{DriverName: killDriver})
		if err != nil {
			return err
		}
		if len(list.GetSlices()) != 1 || len(list.GetSlices()[0].GetDevices()) != len(devs) {
			return fmt.Errorf("slices %v", list.GetSlices())
		}
		return nil
	})
	return createClaims(t, kubeClient(t, layout.IdentityKubeconfigFile(e.root, "operator")), n)
}

// nodeName is the one Node the node-local API serves.
func nodeName(t *testing.T, root string) string {
	t.Helper()
	reader := kubeClient(t, layout.IdentityKubeconfigFile(root, "reader"))
	var node string
	testutil.Eventually(t, "the node-local API's Node", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		nodes, err := reader.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(nodes.Items) != 1 {
			return fmt.Errorf("%d nodes, want 1", len(nodes.Items))
		}
		node = nodes.Items[0].Name
		return nil
	})
	return node
}

// createClaims creates a DeviceClass of killDriver's devices and n claims
// in namespace default, each for one device of it.
func createClaims(t *testing.T, cs kubernetes.Interface, n int) []*resourcev1.ResourceClaim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: killDriver},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", killDriver)},
		}}},
	}
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create DeviceClass %s: %v", class.Name, err)
	}
	var out []*resourcev1.ResourceClaim
	for i := range n {
		rc := &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i), Namespace: "default"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
				{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class.Name}},
			}}},
		}
		got, err := cs.ResourceV1().ResourceClaims(rc.Namespace).Create(ctx, rc, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create ResourceClaim %s: %v", rc.Name, err)
		}
		out = append(out, got)
	}
	return out
}

// preparingDriver prepares every claim allocated to killDriver, with no CDI
// devices (nothing for a container start to resolve).
type preparingDriver struct{}

func (preparingDriver) PrepareResourceClaims(_ context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var res kubeletplugin.PrepareResult
		if c.Status.Allocation == nil {
			res.Err = fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
		} else {
			for _, r := range c.Status.Allocation.Devices.Results {
				if r.Driver == killDriver {
					res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
				}
			}
		}
		out[c.UID] = res
	}
	return out, nil
}

func (preparingDriver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (preparingDriver) HandleError(context.Context, error, string) {}

func (preparingDriver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// servingLoop allocates a device of killResource to one pod after another,
// starts its container and the container of a DRA pod prepared before, Lists
// the pod resources and releases the pod, until stopped or an error.
type servingLoop struct {
	e      *env
	draPod string
	podres podresourcesv1.PodResourcesListerClient
	rounds atomic.Int64
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	err error
}

func startServingLoop(t *testing.T, e *env, draPod string) *servingLoop {
	t.Helper()
	conn, err := rpcutil.DialPeer(layout.PodResourcesSocket(e.root))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	l := &servingLoop{e: e, draPod: draPod, podres: podresourcesv1.NewPodResourcesListerClient(conn), cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { l.cancel(); <-l.done })
	go l.run(ctx)
	return l
}

func (l *servingLoop) run(ctx context.Context) {
	defer close(l.done)
	// A pace, not a wait: the pod resources socket is rate-limited as the
	// kubelet's (100 a second).
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if err := l.round(ctx, fmt.Sprintf("dp-pod-%d", i)); err != nil {
			if ctx.Err() == nil {
				l.mu.Lock()
				l.err = err
				l.mu.Unlock()
			}
			return
		}
		l.rounds.Add(1)
	}
}

// round allocates to pod, starts its container and the DRA pod's, Lists the
// pod resources (which show pod) and releases pod.
func (l *servingLoop) round(ctx context.Context, pod string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := l.e.dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: pod, PodNamespace: "default", PodName: pod, ContainerName: "main",
		Resources: []*dmv1.ResourceRequest{{ResourceName: killResource, Count: 1}}}); err != nil {
		return fmt.Errorf("Allocate %s: %w", pod, err)
	}
	for _, p := range []string{pod, l.draPod} {
		if _, err := l.e.dm.StartContainer(ctx, &dmv1.StartContainerRequest{PodUid: p, ContainerName: "main"}); err != nil {
			return fmt.Errorf("StartContainer %s: %w", p, err)
		}
	}
	list, err := l.podres.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		return fmt.Errorf("pod resources List: %w", err)
	}
	if !slices.ContainsFunc(list.GetPodResources(), func(p *podresourcesv1.PodResources) bool { return p.GetName() == pod }) {
		return fmt.Errorf("pod resources List shows no %s: %v", pod, list.GetPodResources())
	}
	if _, err := l.e.dm.Release(ctx, &dmv1.ReleaseRequest{PodUid: pod}); err != nil {
		return fmt.Errorf("Release %s: %w", pod, err)
	}
	return nil
}

// waitRounds waits until the loop has served n rounds; it fails t when the
// loop stopped on an error.
func (l *servingLoop) waitRounds(t *testing.T, n int64) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("%d rounds served", n), func() bool { return l.rounds.Load() >= n || l.failed() != nil })
	if err := l.failed(); err != nil {
		t.Fatalf("after %d rounds: %v", l.rounds.Load(), err)
	}
}

func (l *servingLoop) failed() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// stop ends the loop and fails t if it had stopped on an error.
func (l *servingLoop) stop(t *testing.T) {
	t.Helper()
	l.cancel()
	<-l.done
	if err := l.failed(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("after %d rounds: %v", l.rounds.Load(), err)
	}
}
