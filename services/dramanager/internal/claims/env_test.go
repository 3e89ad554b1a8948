package claims_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/metadata"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

var spans = tracetest.NewSpanRecorder()

func TestMain(m *testing.M) {
	otel.SetTextMapPropagator(telemetry.Propagator)
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	os.Exit(m.Run())
}

const ns = "ns"

// plugin is a DRA driver's logic behind the upstream kubeletplugin
// helper: it answers each claim with its allocated devices of this
// driver, one CDI ID each, counts the calls per claim, and fails as told.
type plugin struct {
	driver string

	mu             sync.Mutex
	prepares       map[string]int // claim name → NodePrepareResources
	unprepares     map[string]int
	failPrepare    map[string]string // claim name → error
	unprepareFails int               // the next ones fail
	traceparents   []string
	// twist changes the answer for a claim (by name).
	twist map[string]func([]kubeletplugin.Device) []kubeletplugin.Device
}

func newPlugin(driver string) *plugin {
	return &plugin{driver: driver, prepares: map[string]int{}, unprepares: map[string]int{}, failPrepare: map[string]string{},
		twist: map[string]func([]kubeletplugin.Device) []kubeletplugin.Device{}}
}

func (p *plugin) PrepareResourceClaims(ctx context.Context, cs []*resourcev1.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		p.traceparents = append(p.traceparents, md.Get("traceparent")...)
	}
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range cs {
		p.prepares[c.Name]++
		if msg := p.failPrepare[c.Name]; msg != "" {
			out[c.UID] = kubeletplugin.PrepareResult{Err: errors.New(msg)}
			continue
		}
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == p.driver {
				devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
					CDIDeviceIDs: []string{p.driver + "/dev=" + r.Device}})
			}
		}
		if f := p.twist[c.Name]; f != nil {
			devs = f(devs)
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (p *plugin) UnprepareResourceClaims(_ context.Context, cs []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range cs {
		p.unprepares[c.Name]++
		if p.unprepareFails > 0 {
			p.unprepareFails--
			out[c.UID] = fmt.Errorf("device of %s is busy", c.Name)
			continue
		}
		out[c.UID] = nil
	}
	return out, nil
}

func (p *plugin) HandleError(context.Context, error, string) {}

func (p *plugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (p *plugin) counts(claim string) (prepares, unprepares int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepares[claim], p.unprepares[claim]
}

func (p *plugin) set(f func(p *plugin)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f(p)
}

// env is a node: the node-local API, a DRA driver built on the upstream
// helper on its Unix socket with a pool of devices, registered with the
// dramanager's DRA registry (the Drivers), claimalloc's Reserver, and
// a journal in a temporary dir.
type env struct {
	t      *testing.T
	api    *dratest.API
	plugin *plugin
	driver *dratest.Driver
	reg    *drivers.Registry
	res    *claimalloc.Allocator
	dir    string
	mgr    *claims.Manager
	// journal is the current start's; retry, when set, is the first
	// retry's delay (else 10 ms).
	journal *claims.Journal
	retry   time.Duration
}

const driverName = "gpu.example.com"

func newEnv(t *testing.T) *env {
	t.Helper()
	root := testutil.TempDir(t)
	e := &env{t: t, api: dratest.StartAPI(t, root), dir: filepath.Join(root, "dra-manager")}
	e.api.Namespace(t, ns)
	if err := os.MkdirAll(e.dir, 0o750); err != nil {
		t.Fatal(err)
	}
	reg, err := drivers.New(drivers.Config{Client: e.api.Client, NodeName: dratest.Node, AllowedDirs: []string{e.api.Root}})
	if err != nil {
		t.Fatal(err)
	}
	reg.Start()
	t.Cleanup(reg.Close)
	e.reg = reg
	e.plugin = newPlugin(driverName)
	e.driver = e.addDriver(e.plugin, "gpu", 4)
	if e.res, err = claimalloc.New(e.api.Client, dratest.Node, nil); err != nil {
		t.Fatal(err)
	}
	e.start()
	t.Cleanup(e.stop)
	return e
}

// addDriver starts p's driver with a pool of n devices ("<class>-<i>")
// and the DeviceClass class selecting them, registers it with e.reg and
// waits until it is connected.
func (e *env) addDriver(p *plugin, class string, n int) *dratest.Driver {
	t := e.t
	t.Helper()
	d := dratest.StartDriverWith(t, e.api, p.driver, "", p)
	devs := make([]resourcev1.Device, n)
	for i := range devs {
		devs[i] = resourcev1.Device{Name: fmt.Sprintf("%s-%d", class, i)}
	}
	if err := d.Helper.PublishResources(context.Background(), resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{dratest.Node: {Slices: []resourceslice.Slice{{Devices: devs}}}},
	}); err != nil {
		t.Fatal(err)
	}
	dratest.WaitSlices(t, e.api.Client, p.driver, 1, len(devs))
	dc := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Spec: resourcev1.DeviceClassSpec{
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + p.driver + `"`}}},
	}}
	if _, err := e.api.Client.ResourceV1().DeviceClasses().Create(context.Background(), dc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.Register(context.Background(), drivers.Registration{Driver: p.driver, Endpoint: d.Endpoint, Services: d.Services,
		SocketPath: d.RegSocket, Generation: d.Generation(t)}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "driver "+p.driver+" connected", func() error {
		for _, di := range e.reg.Drivers(p.driver) {
			for _, in := range di.Instances {
				if in.Connected {
					return nil
				}
			}
		}
		return errors.New("not connected")
	})
	return d
}

// start opens and loads the journal and a Manager over it, as the
// dramanager does at start.
func (e *env) start() {
	e.t.Helper()
	j := claims.NewJournal(store.New(e.dir, store.Options{}))
	if _, err := j.Load(); err != nil {
		e.t.Fatal(err)
	}
	e.journal = j
	retry := cmp.Or(e.retry, 10*time.Millisecond)
	m, err := claims.New(claims.Config{Reserver: e.res, Drivers: e.reg, Journal: j, RetryInitial: retry, RetryMax: 5 * retry,
		AllocatedHere: func(c *resourcev1.ResourceClaim) bool {
			return c.Annotations[claimalloc.AllocatedByAnnotation] == dratest.Node
		}})
	if err != nil {
		e.t.Fatal(err)
	}
	e.mgr = m
}

// stop stops the Manager and closes the journal; every acknowledged
// change is durable already, so this is what a kill leaves on disk.
func (e *env) stop() {
	if e.mgr == nil {
		return
	}
	e.mgr.Close()
	if err := e.journal.Flush(); err != nil {
		e.t.Error(err)
	}
	e.mgr = nil
}

// crash stops the Manager's loops and abandons its journal without a
// flush, as a kill -9 leaves it: only what was acknowledged (durable) is
// there for the next start. The abandoned journal is never flushed: its
// flush would write after the next start's.
func (e *env) crash() {
	e.mgr.Close()
	e.mgr = nil
}

// claim creates a claim for a device of class gpu per request named in
// reqs.
func (e *env) claim(name string, reqs ...string) {
	e.t.Helper()
	e.claimOf(e.t, "gpu", name, reqs...)
}

// claimOf creates a claim for a device of class per request named in reqs.
func (e *env) claimOf(t testing.TB, class, name string, reqs ...string) {
	t.Helper()
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	for _, r := range reqs {
		c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourcev1.DeviceRequest{Name: r, Exactly: &resourcev1.ExactDeviceRequest{
			DeviceClassName: class, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1}})
	}
	if _, err := e.api.Client.ResourceV1().ResourceClaims(ns).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) get(name string) *resourcev1.ResourceClaim {
	e.t.Helper()
	c, err := e.api.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// podReq is a pod using claim (as pod claim "c") in one container "main".
func podReq(pod string, claimNames ...string) claims.PrepareRequest {
	r := claims.PrepareRequest{Pod: claims.PodRef{UID: "uid-" + pod, Namespace: ns, Name: pod}, Containers: []claims.ContainerClaims{{Container: "main"}}}
	for i, c := range claimNames {
		pc := fmt.Sprintf("c%d", i)
		r.PodClaims = append(r.PodClaims, claims.PodClaim{Name: pc, ResourceClaimName: c})
		r.Containers[0].Claims = append(r.Containers[0].Claims, claims.ContainerClaim{Name: pc})
	}
	return r
}
