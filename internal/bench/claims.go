package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// benchDriverName is the claims phase's DRA driver.
const benchDriverName = "claims.bench.nodeplug.test"

// benchClaimDevices is how many devices it publishes: enough that the
// claims whose unprepare is still owed leave devices to allocate (one
// slice holds at most 128).
const benchClaimDevices = 128

// ClaimsResult is prepare+release pairs of DRA claims with some callers:
// each pair a new claim (created before the timing), allocated on the node
// and prepared by an in-process driver on the upstream kubeletplugin
// helper, then its pod released.
type ClaimsResult struct {
	Callers     int     `json:"callers"`
	Pairs       int     `json:"pairs"`
	PairsPerSec float64 `json:"pairs_per_sec"`
	// Prepare is DRAService.PrepareResources as the caller sees it;
	// Release the whole-pod Release (the unprepare runs after it);
	// DriverPrepare the driver's own NodePrepareResources (its gRPC
	// handler, which GETs the claim from the API).
	Prepare       Dist `json:"prepare"`
	Release       Dist `json:"release"`
	DriverPrepare Dist `json:"driver_node_prepare_resources"`
	// PrepareP99OverDriver is Prepare's p99 over DriverPrepare's.
	PrepareP99OverDriver float64 `json:"prepare_p99_over_driver_p99"`
}

// benchPlugin prepares what the allocation names, one CDI ID per claim.
type benchPlugin struct{}

func (benchPlugin) PrepareResourceClaims(_ context.Context, claims []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var devs []kubeletplugin.Device
		if c.Status.Allocation != nil {
			for _, r := range c.Status.Allocation.Devices.Results {
				devs = append(devs, kubeletplugin.Device{PoolName: r.Pool, DeviceName: r.Device, Requests: []string{r.Request},
					CDIDeviceIDs: []string{benchDriverName + "/dev=" + string(c.UID)}})
			}
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (benchPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (benchPlugin) HandleError(context.Context, error, string) {}

func (benchPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

// driverTimes records the driver's NodePrepareResources handler times.
type driverTimes struct {
	mu sync.Mutex
	d  []time.Duration
}

func (t *driverTimes) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !strings.HasSuffix(info.FullMethod, "/NodePrepareResources") {
		return handler(ctx, req)
	}
	t0 := time.Now()
	resp, err := handler(ctx, req)
	t.mu.Lock()
	t.d = append(t.d, time.Since(t0))
	t.mu.Unlock()
	return resp, err
}

func (t *driverTimes) take() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.d
	t.d = nil
	return out
}

// benchKubeClient loads a kubeconfig the devicemanager wrote, unthrottled.
func benchKubeClient(file string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", file)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 10000, 10000
	return kubernetes.NewForConfig(cfg)
}

// claims measures prepare+release pairs with each of cfg.ClaimCallers.
func (r *runner) claims(ctx context.Context) ([]ClaimsResult, error) {
	driverCS, err := benchKubeClient(layout.KubeconfigFile(r.root))
	if err != nil {
		return nil, fmt.Errorf("the driver kubeconfig: %w", err)
	}
	operator, err := benchKubeClient(layout.IdentityKubeconfigFile(r.root, "operator"))
	if err != nil {
		return nil, fmt.Errorf("the operator kubeconfig: %w", err)
	}
	nodes, err := operator.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		return nil, fmt.Errorf("the local API's one Node: %v (%v)", nodes, err)
	}
	node := nodes.Items[0].Name
	conn, err := rpcutil.DialPeer(r.st.Addr("dramanager"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close() }()
	dra := dmv1.NewDRAServiceClient(conn)

	dataDir := filepath.Join(r.root, "plugins", benchDriverName)
	if err := os.MkdirAll(dataDir, 0o750); err != nil {
		return nil, err
	}
	times := &driverTimes{}
	helper, err := kubeletplugin.Start(ctx, benchPlugin{},
		kubeletplugin.DriverName(benchDriverName), kubeletplugin.NodeName(node), kubeletplugin.KubeClient(driverCS),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(r.root, layout.PluginsRegistryDirName)),
		kubeletplugin.PluginDataDirectoryPath(dataDir), kubeletplugin.GRPCInterceptor(times.intercept))
	if err != nil {
		return nil, fmt.Errorf("start driver %s: %w", benchDriverName, err)
	}
	defer helper.Stop()
	var devices []resourcev1.Device
	for i := range benchClaimDevices {
		devices = append(devices, resourcev1.Device{Name: fmt.Sprintf("dev-%d", i)})
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		node: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}); err != nil {
		return nil, fmt.Errorf("publish the devices: %w", err)
	}
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: benchDriverName},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", benchDriverName)},
		}}},
	}
	if _, err := operator.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("create the DeviceClass: %w", err)
	}
	// The driver is registered and its slice published once a claim can
	// be prepared: warm up with one pair until it succeeds.
	if err := r.claimWarmup(ctx, operator, dra); err != nil {
		return nil, err
	}
	times.take()

	var out []ClaimsResult
	for _, callers := range r.cfg.ClaimCallers {
		res, err := r.claimPairs(ctx, operator, dra, times, callers)
		if err != nil {
			return nil, fmt.Errorf("callers=%d: %w", callers, err)
		}
		r.logf("claims: callers=%d %.0f pairs/s, prepare %s", callers, res.PairsPerSec, res.Prepare)
		out = append(out, res)
	}
	return out, nil
}

func createBenchClaim(ctx context.Context, cs kubernetes.Interface, name string) error {
	_, err := cs.ResourceV1().ResourceClaims("default").Create(ctx, &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "dev", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: benchDriverName},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create ResourceClaim %s: %w", name, err)
	}
	return nil
}

func prepareReq(pod, claim string) *dmv1.PrepareResourcesRequest {
	return &dmv1.PrepareResourcesRequest{
		PodUid: pod, PodNamespace: "default", PodName: pod,
		PodClaims:  []*dmv1.PodClaim{{Name: "c", ResourceClaimName: claim}},
		Containers: []*dmv1.ContainerClaims{{Name: "main", Claims: []*dmv1.ContainerClaim{{Name: "c"}}}},
	}
}

func (r *runner) claimWarmup(ctx context.Context, operator kubernetes.Interface, dra dmv1.DRAServiceClient) error {
	if err := createBenchClaim(ctx, operator, "bench-warmup"); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := dra.PrepareResources(ctx, prepareReq("bench-warmup", "bench-warmup"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no claim could be prepared within a minute of the driver's start: %w", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := r.dm.Release(ctx, &dmv1.ReleaseRequest{PodUid: "bench-warmup"}); err != nil {
		return fmt.Errorf("release the warm-up pod: %w", err)
	}
	return nil
}

// claimPairs runs cfg.ClaimPairs pairs per caller, each on a claim created
// before the timing.
func (r *runner) claimPairs(ctx context.Context, operator kubernetes.Interface, dra dmv1.DRAServiceClient, times *driverTimes, callers int) (ClaimsResult, error) {
	n := r.cfg.ClaimPairs
	for c := range callers {
		for i := range n {
			if err := createBenchClaim(ctx, operator, fmt.Sprintf("bench-%d-%d-%d", callers, c, i)); err != nil {
				return ClaimsResult{}, err
			}
		}
	}
	times.take()
	var mu sync.Mutex
	var prep, rel []time.Duration
	errc := make(chan error, callers)
	var wg sync.WaitGroup
	t0 := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				name := fmt.Sprintf("bench-%d-%d-%d", callers, c, i)
				s := time.Now()
				if _, err := dra.PrepareResources(ctx, prepareReq(name, name)); err != nil {
					errc <- fmt.Errorf("prepare %s: %w", name, err)
					return
				}
				p := time.Since(s)
				s = time.Now()
				if _, err := r.dm.Release(ctx, &dmv1.ReleaseRequest{PodUid: name}); err != nil {
					errc <- fmt.Errorf("release %s: %w", name, err)
					return
				}
				mu.Lock()
				prep, rel = append(prep, p), append(rel, time.Since(s))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(t0)
	select {
	case err := <-errc:
		return ClaimsResult{}, err
	default:
	}
	res := ClaimsResult{Callers: callers, Pairs: len(prep), PairsPerSec: float64(len(prep)) / elapsed.Seconds(),
		Prepare: NewDist(prep), Release: NewDist(rel), DriverPrepare: NewDist(times.take())}
	if res.DriverPrepare.P99 > 0 {
		res.PrepareP99OverDriver = res.Prepare.P99 / res.DriverPrepare.P99
	}
	return res, nil
}
