package upstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// Disconnect delays (--dra-disconnect-delay): how long the dramanager
// keeps the slices of a driver none of whose instances is connected, and,
// after its start, waits for drivers to register again. Short where a test
// waits for the deletion; long where a test checks that nothing is deleted
// across a restart, so that a slow re-registration on a loaded machine is
// not taken for a loss.
const (
	shortDelay = 2 * time.Second
	longDelay  = 5 * time.Minute
)

// draNode is the five services over one root dir, nodeplug-apiserver
// serving the node-local resource API on a free loopback port (kept across
// its restarts: the kubeconfigs name it), and the DRA drivers the test
// started, each a process of cmd/dradriver.
type draNode struct {
	t    *testing.T
	root string
	node string
	// svc runs the watcher, the devicemanager and the reconciler; api
	// nodeplug-apiserver and dmp the dramanager, which alone take the
	// node's name (and the dramanager the DRA flags).
	svc, api, dmp *stack.Processes
	drivers       []*stack.Process
	// driverConfig is the drivers' kubeconfig with a cluster's API server
	// (startClusterNode); empty: the one nodeplug-apiserver writes.
	driverConfig string
}

// startDRANode starts the services over a new root dir; they and every
// driver started with startDriver stop when t ends (their logs shown when
// it failed).
func startDRANode(t *testing.T, delay time.Duration) *draNode {
	t.Helper()
	return startDRANodeEnv(t, delay)
}

// startDRANodeEnv is startDRANode with dmEnv added to the dramanager's
// environment.
func startDRANodeEnv(t *testing.T, delay time.Duration, dmEnv ...string) *draNode {
	t.Helper()
	root := testutil.TempDir(t)
	n := &draNode{t: t, root: root, node: "node-" + strconv.Itoa(os.Getpid())}
	n.svc = stack.NewProcesses(binDir, root)
	n.api = stack.NewProcesses(binDir, root)
	n.api.Args = []string{"--node-name", n.node}
	n.dmp = stack.NewProcesses(binDir, root, dmEnv...)
	n.dmp.Args = []string{
		"--node-name", n.node,
		"--dra-disconnect-delay", delay.String(),
	}
	t.Cleanup(n.stop)
	n.startAPI()
	ctx := ctxT(t)
	for _, name := range []string{"watcher", "devicemanager"} {
		if err := n.svc.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	n.startDRA()
	if err := n.svc.Start(ctx, "reconciler"); err != nil {
		t.Fatal(err)
	}
	return n
}

// stop stops the drivers and the services, in the reverse of their start
// order, showing their logs when the test failed.
func (n *draNode) stop() {
	for _, d := range n.drivers {
		_ = d.Stop(10 * time.Second)
	}
	for _, s := range []struct {
		p    *stack.Processes
		name string
	}{{n.svc, "reconciler"}, {n.dmp, "dramanager"}, {n.svc, "devicemanager"}, {n.svc, "watcher"}, {n.api, "apiserver"}} {
		if p := s.p.Process(s.name); p != nil {
			_ = p.Stop(10 * time.Second)
			if n.t.Failed() {
				n.t.Logf("%s log:\n%s", s.name, p.Logs())
			}
		}
	}
	if n.t.Failed() {
		for _, d := range n.drivers {
			n.t.Logf("driver %v log:\n%s", d.Cmd.Args, d.Logs())
		}
	}
}

// startAPI starts nodeplug-apiserver (again, on the same address) and
// waits until the resource API answers.
func (n *draNode) startAPI() {
	n.t.Helper()
	if err := n.api.Start(ctxT(n.t), "apiserver"); err != nil {
		n.t.Fatal(err)
	}
	cs := n.client(n.kubeconfig())
	testutil.Eventually(n.t, "the resource API answering", func() error {
		_, err := cs.Discovery().ServerVersion()
		return err
	})
}

// killAPI SIGKILLs nodeplug-apiserver.
func (n *draNode) killAPI() { n.api.Kill("apiserver") }

// apiProcess is nodeplug-apiserver's current process.
func (n *draNode) apiProcess() *stack.Process { return n.api.Process("apiserver") }

// startDRA starts the dramanager (again, on the same addresses).
func (n *draNode) startDRA() {
	n.t.Helper()
	if err := n.dmp.Start(ctxT(n.t), "dramanager"); err != nil {
		n.t.Fatal(err)
	}
}

// killDRA SIGKILLs the dramanager.
func (n *draNode) killDRA() { n.dmp.Kill("dramanager") }

// draProcess is the dramanager's current process.
func (n *draNode) draProcess() *stack.Process { return n.dmp.Process("dramanager") }

// kubeconfig is the drivers' kubeconfig: the one nodeplug-apiserver writes
// at its start, or the cluster's driver identity's.
func (n *draNode) kubeconfig() string {
	if n.driverConfig != "" {
		return n.driverConfig
	}
	return filepath.Join(n.root, "nodeplug", "kubeconfig")
}

// restConfig loads a kubeconfig, waiting for the file to be written.
func (n *draNode) restConfig(path string) *rest.Config {
	n.t.Helper()
	var cfg *rest.Config
	testutil.Eventually(n.t, "kubeconfig "+path, func() error {
		var err error
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
		return err
	})
	return cfg
}

// client is a clientset for the kubeconfig at path.
func (n *draNode) client(path string) kubernetes.Interface {
	n.t.Helper()
	cs, err := kubernetes.NewForConfig(n.restConfig(path))
	if err != nil {
		n.t.Fatal(err)
	}
	return cs
}

// driver is one running cmd/dradriver.
type driver struct {
	n       *draNode
	name    string
	devices string // its devices file
	proc    *stack.Process
}

// readerConfig is the reader's kubeconfig, written beside the driver's.
func (n *draNode) readerConfig() string {
	return filepath.Join(n.root, "nodeplug", "kubeconfig-reader")
}

// startDriver starts a DRA driver process named name, pointed at the local
// API with nothing but KUBECONFIG and the upstream driver's flags, publishing
// devs; extra are further flags (--rolling-update UID).
func (n *draNode) startDriver(name string, devs []resourcev1.Device, extra ...string) *driver {
	n.t.Helper()
	d := &driver{n: n, name: name, devices: filepath.Join(n.root, name+"-"+strconv.Itoa(len(n.drivers))+".json")}
	d.setDevices(devs)
	args := append([]string{
		"--drivername", name,
		"--node-name", n.node,
		"--datadir", filepath.Join(n.root, "plugins"),
		"--plugin-registration-path", filepath.Join(n.root, "plugins_registry"),
		"--cdi-dir", filepath.Join(n.root, "cdi"),
		"--devices-file", d.devices,
	}, extra...)
	p, err := stack.Start(filepath.Join(binDir, "dradriver"), args, []string{"KUBECONFIG=" + n.kubeconfig()})
	if err != nil {
		n.t.Fatal(err)
	}
	d.proc = p
	n.drivers = append(n.drivers, p)
	return d
}

// setDevices writes the devices file; publish makes a running driver
// publish it.
func (d *driver) setDevices(devs []resourcev1.Device) {
	d.n.t.Helper()
	data, err := json.Marshal(devs)
	if err != nil {
		d.n.t.Fatal(err)
	}
	if err := os.WriteFile(d.devices, data, 0o600); err != nil {
		d.n.t.Fatal(err)
	}
}

// publish has the driver publish its devices file again (SIGHUP).
func (d *driver) publish(devs []resourcev1.Device) {
	d.n.t.Helper()
	d.setDevices(devs)
	if err := d.proc.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		d.n.t.Fatal(err)
	}
}

// slices lists the node's ResourceSlices of driver, selected by the server.
func (n *draNode) slices(cs kubernetes.Interface, driver string) (*resourcev1.ResourceSliceList, error) {
	sel := fields.Set{resourcev1.ResourceSliceSelectorDriver: driver, resourcev1.ResourceSliceSelectorNodeName: n.node}.AsSelector().String()
	return cs.ResourceV1().ResourceSlices().List(ctxT(n.t), metav1.ListOptions{FieldSelector: sel})
}

// waitSlices waits until the driver's slices are one slice holding exactly
// the devices want (by name, attributes and capacity) and returns it.
func (n *draNode) waitSlices(cs kubernetes.Interface, driver string, want []resourcev1.Device) resourcev1.ResourceSlice {
	n.t.Helper()
	var got resourcev1.ResourceSlice
	testutil.Eventually(n.t, fmt.Sprintf("%s's slice with devices %v", driver, deviceNames(want)), func() error {
		list, err := n.slices(cs, driver)
		if err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d slices: %v", len(list.Items), list.Items)
		}
		got = list.Items[0]
		return sameDevices(got.Spec.Devices, want)
	})
	return got
}

// waitNoSlices waits until the driver has no slices on the node.
func (n *draNode) waitNoSlices(cs kubernetes.Interface, driver string) {
	n.t.Helper()
	testutil.Eventually(n.t, driver+"'s slices deleted", func() error {
		list, err := n.slices(cs, driver)
		if err != nil {
			return err
		}
		if len(list.Items) != 0 {
			return fmt.Errorf("%d slices left", len(list.Items))
		}
		return nil
	})
}

// waitRegistered waits until the reconciler lists driver as a registered
// DRA driver.
func (n *draNode) waitRegistered(driver string) *rcv1.DRADriver {
	n.t.Helper()
	conn, err := rpcutil.DialPeer(n.svc.Addr("reconciler"))
	if err != nil {
		n.t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := rcv1.NewReconcilerServiceClient(conn)
	var got *rcv1.DRADriver
	testutil.Eventually(n.t, driver+" registered", func() error {
		resp, err := client.ListDrivers(ctxT(n.t), &rcv1.ListDriversRequest{})
		if err != nil {
			return err
		}
		for _, d := range resp.GetDraDrivers() {
			if d.GetName() == driver {
				got = d
				return nil
			}
		}
		return fmt.Errorf("last: %v", resp.GetDraDrivers())
	})
	return got
}

func deviceNames(devs []resourcev1.Device) []string {
	out := make([]string, 0, len(devs))
	for _, d := range devs {
		out = append(out, d.Name)
	}
	slices.Sort(out)
	return out
}

// sameDevices compares devices by name, attributes and capacity, in any
// order.
func sameDevices(got, want []resourcev1.Device) error {
	if g, w := deviceNames(got), deviceNames(want); !slices.Equal(g, w) {
		return fmt.Errorf("devices %v, want %v", g, w)
	}
	byName := map[string]resourcev1.Device{}
	for _, d := range got {
		byName[d.Name] = d
	}
	for _, w := range want {
		g := byName[w.Name]
		if len(g.Attributes) != len(w.Attributes) || len(g.Capacity) != len(w.Capacity) {
			return fmt.Errorf("device %s: attributes %v capacity %v, want %v %v", w.Name, g.Attributes, g.Capacity, w.Attributes, w.Capacity)
		}
		for k, wa := range w.Attributes {
			ga, ok := g.Attributes[k]
			if !ok || fmt.Sprint(ptrVal(ga.StringValue), ptrVal(ga.IntValue), ptrVal(ga.BoolValue), ptrVal(ga.VersionValue)) !=
				fmt.Sprint(ptrVal(wa.StringValue), ptrVal(wa.IntValue), ptrVal(wa.BoolValue), ptrVal(wa.VersionValue)) {
				return fmt.Errorf("device %s attribute %s: %+v, want %+v", w.Name, k, ga, wa)
			}
		}
		for k, wc := range w.Capacity {
			gc, ok := g.Capacity[k]
			if !ok || gc.Value.Cmp(wc.Value) != 0 {
				return fmt.Errorf("device %s capacity %s: %v, want %v", w.Name, k, gc.Value.String(), wc.Value.String())
			}
		}
	}
	return nil
}

func ptrVal[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}

// gpu is a device with a model attribute, an index and a memory capacity.
func gpu(name, model string, index int64, memory string) resourcev1.Device {
	return resourcev1.Device{
		Name: name,
		Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"model": {StringValue: &model},
			"index": {IntValue: &index},
		},
		Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			"memory": {Value: resource.MustParse(memory)},
		},
	}
}

// rv is a resourceVersion as the number the local API makes it (the
// tests compare them: they only grow).
func rv(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("resourceVersion %q: %v", s, err)
	}
	return v
}

// alive fails the test when p has exited (its exit was reaped: a signal
// to it fails).
func alive(t *testing.T, p *stack.Process) {
	t.Helper()
	if err := p.Cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("%s is not running (%v, exit %v)\n%s", p.Name, err, p.Err(), p.Logs())
	}
}

// draClient is a DRAService client on the dramanager's socket.
func (n *draNode) draClient() dmv1.DRAServiceClient {
	n.t.Helper()
	conn, err := rpcutil.DialPeer(n.dmp.Addr("dramanager"))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = conn.Close() })
	return dmv1.NewDRAServiceClient(conn)
}

// waitDriver waits until the dramanager's ListDRADrivers shows driver
// with instances for which cond holds, and returns it.
func (n *draNode) waitDriver(driver string, cond func(*dmv1.DRADriver) error) *dmv1.DRADriver {
	n.t.Helper()
	client := n.draClient()
	var got *dmv1.DRADriver
	testutil.Eventually(n.t, "ListDRADrivers: "+driver, func() error {
		resp, err := client.ListDRADrivers(ctxT(n.t), &dmv1.ListDRADriversRequest{DriverName: driver})
		if err != nil {
			return err
		}
		for _, d := range resp.GetDrivers() {
			if d.GetName() == driver {
				got = d
				return cond(d)
			}
		}
		return fmt.Errorf("not listed among %v", resp.GetDrivers())
	})
	return got
}

// oneServing holds when exactly one instance serves, connected, and it is
// the one on endpoint (any, when empty), with want instances in all.
func oneServing(want int, endpoint string) func(*dmv1.DRADriver) error {
	return func(d *dmv1.DRADriver) error {
		if len(d.GetInstances()) != want {
			return fmt.Errorf("%d instances, want %d: %v", len(d.GetInstances()), want, d.GetInstances())
		}
		var serving []*dmv1.DRADriverInstance
		for _, in := range d.GetInstances() {
			if in.GetServing() {
				serving = append(serving, in)
			}
		}
		if len(serving) != 1 || !serving[0].GetConnected() || (endpoint != "" && serving[0].GetEndpoint() != endpoint) {
			return fmt.Errorf("serving %v, want one connected on %q", serving, endpoint)
		}
		return nil
	}
}

// ctl runs nodeplugctl against the node and returns its standard output.
func (n *draNode) ctl(args ...string) []byte {
	n.t.Helper()
	cmd := exec.CommandContext(ctxT(n.t), filepath.Join(binDir, "nodeplugctl"), append([]string{"--root-dir", n.root}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		n.t.Fatalf("nodeplugctl %v: %v\n%s", args, err, stderr.Bytes())
	}
	return out
}

// waitShown waits until ListResourceSlices and nodeplugctl slices show the
// slice as the API serves it: name, UID, resourceVersion, driver, pool and
// each device with its attributes and capacity.
func (n *draNode) waitShown(want resourcev1.ResourceSlice) {
	n.t.Helper()
	client := n.draClient()
	check := func(resp *dmv1.ListResourceSlicesResponse) error {
		if len(resp.GetSlices()) != 1 {
			return fmt.Errorf("%d slices: %v", len(resp.GetSlices()), resp.GetSlices())
		}
		got := resp.GetSlices()[0]
		if got.GetName() != want.Name || got.GetUid() != string(want.UID) || got.GetResourceVersion() != want.ResourceVersion ||
			got.GetDriver() != want.Spec.Driver || got.GetNodeName() != *want.Spec.NodeName ||
			got.GetPool().GetName() != want.Spec.Pool.Name || got.GetPool().GetGeneration() != want.Spec.Pool.Generation {
			return fmt.Errorf("slice %v, want %s (UID %s, resourceVersion %s, pool %s/%d)", got, want.Name, want.UID, want.ResourceVersion, want.Spec.Pool.Name, want.Spec.Pool.Generation)
		}
		byName := map[string]*dmv1.Device{}
		for _, d := range got.GetDevices() {
			byName[d.GetName()] = d
		}
		if len(byName) != len(want.Spec.Devices) {
			return fmt.Errorf("devices %v, want %v", got.GetDevices(), deviceNames(want.Spec.Devices))
		}
		for _, w := range want.Spec.Devices {
			g := byName[w.Name]
			if g == nil {
				return fmt.Errorf("no device %s in %v", w.Name, got.GetDevices())
			}
			if m := g.GetAttributes()["model"]; m != *w.Attributes["model"].StringValue {
				return fmt.Errorf("device %s model %q, want %q", w.Name, m, *w.Attributes["model"].StringValue)
			}
			if c, wc := g.GetCapacity()["memory"], w.Capacity["memory"].Value; c != wc.String() {
				return fmt.Errorf("device %s memory %q, want %q", w.Name, c, wc.String())
			}
		}
		return nil
	}
	testutil.Eventually(n.t, "ListResourceSlices showing "+want.Name, func() error {
		resp, err := client.ListResourceSlices(ctxT(n.t), &dmv1.ListResourceSlicesRequest{DriverName: want.Spec.Driver})
		if err != nil {
			return err
		}
		return check(resp)
	})
	testutil.Eventually(n.t, "nodeplugctl slices showing "+want.Name, func() error {
		var resp dmv1.ListResourceSlicesResponse
		if err := protojson.Unmarshal(n.ctl("slices", "-o", "json", "--driver", want.Spec.Driver), &resp); err != nil {
			return fmt.Errorf("nodeplugctl slices -o json: %w", err)
		}
		if err := check(&resp); err != nil {
			return err
		}
		table := string(n.ctl("slices"))
		for _, d := range want.Spec.Devices {
			if !strings.Contains(table, d.Name) || !strings.Contains(table, "model="+*d.Attributes["model"].StringValue) {
				return fmt.Errorf("nodeplugctl slices shows no %s with model=%s:\n%s", d.Name, *d.Attributes["model"].StringValue, table)
			}
		}
		return nil
	})
}

// watchSlices subscribes to WatchResourceSlices for driver and, once the
// snapshot is synced, returns; the channel then gets nil when an UPDATED
// change with exactly the devices want arrives, or the error that ended
// the wait.
func (n *draNode) watchSlices(driver string, want []string) <-chan error {
	n.t.Helper()
	ctx := ctxT(n.t)
	stream, err := n.draClient().WatchResourceSlices(ctx, &dmv1.WatchResourceSlicesRequest{DriverName: driver})
	if err != nil {
		n.t.Fatal(err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			n.t.Fatalf("WatchResourceSlices before synced: %v", err)
		}
		if resp.GetSynced() != nil {
			break
		}
	}
	out := make(chan error, 1)
	go func() {
		var seen []string
		for {
			resp, err := stream.Recv()
			if err != nil {
				out <- fmt.Errorf("%w; changes seen: %v", err, seen)
				return
			}
			ch := resp.GetChange()
			if ch == nil {
				continue
			}
			var names []string
			for _, d := range ch.GetSlice().GetDevices() {
				names = append(names, d.GetName())
			}
			slices.Sort(names)
			seen = append(seen, fmt.Sprintf("%s %v", ch.GetType(), names))
			if ch.GetType() == dmv1.ResourceSliceChangeType_RESOURCE_SLICE_CHANGE_TYPE_UPDATED && slices.Equal(names, want) {
				out <- nil
				return
			}
		}
	}()
	return out
}
