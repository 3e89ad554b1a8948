package upstream

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

const testDriver = "gpu.nodeplug.test"

// TestDRADriverSlices runs the upstream test driver (the kubeletplugin
// helper) as its own process against the node-local API: it registers and
// the dramanager connects to it (ListDRADrivers, nodeplugctl drivers);
// its devices appear as one ResourceSlice of this node owned by the Node,
// the same through client-go, ListResourceSlices and nodeplugctl slices; a
// change to its devices updates that slice (and WatchResourceSlices
// streams it); once it stops, its slice is
// deleted after the disconnect delay.
func TestDRADriverSlices(t *testing.T) {
	n := startDRANode(t, shortDelay)
	cs := n.client(n.readerConfig())
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi"), gpu("gpu-1", "a100", 1, "40Gi")}
	d := n.startDriver(testDriver, devs)

	reg := n.waitRegistered(testDriver)
	if len(reg.GetSupportedVersions()) == 0 {
		t.Errorf("registered with no versions: %v", reg)
	}
	conn := n.waitDriver(testDriver, oneServing(1, ""))
	if in := conn.GetInstances()[0]; in.GetService() != "v1.DRAPlugin" || in.GetEndpoint() != filepath.Join(n.root, "plugins", testDriver, "dra.sock") {
		t.Errorf("instance %v: want v1.DRAPlugin on the driver's dra.sock", in)
	}
	var ctlDrivers map[string]json.RawMessage
	if err := json.Unmarshal(n.ctl("drivers", "-o", "json"), &ctlDrivers); err != nil {
		t.Fatalf("nodeplugctl drivers -o json: %v", err)
	}
	if !strings.Contains(string(ctlDrivers["draDriverConnections"]), `"serving": true`) &&
		!strings.Contains(string(ctlDrivers["draDriverConnections"]), `"serving":true`) {
		t.Errorf("nodeplugctl drivers -o json shows no serving instance: %s", ctlDrivers["draDriverConnections"])
	}

	s := n.waitSlices(cs, testDriver, devs)
	if s.Spec.Driver != testDriver || s.Spec.NodeName == nil || *s.Spec.NodeName != n.node || s.Spec.Pool.Name != n.node {
		t.Errorf("slice spec: driver %q node %v pool %q, want %q %q %q", s.Spec.Driver, s.Spec.NodeName, s.Spec.Pool.Name, testDriver, n.node, n.node)
	}
	node, err := cs.CoreV1().Nodes().Get(ctxT(t), n.node, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get the Node: %v", err)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "Node" || s.OwnerReferences[0].Name != n.node || s.OwnerReferences[0].UID != node.UID || node.UID == "" {
		t.Errorf("owner references %+v, want the Node %s with UID %q", s.OwnerReferences, n.node, node.UID)
	}
	n.waitShown(s)

	// A device goes, one changes, one comes: the same slice (the helper
	// updates in place) with the new devices, at a later resourceVersion.
	changed := []resourcev1.Device{gpu("gpu-1", "h100", 1, "80Gi"), gpu("gpu-2", "h100", 2, "80Gi")}
	watched := n.watchSlices(testDriver, deviceNames(changed))
	d.publish(changed)
	s2 := n.waitSlices(cs, testDriver, changed)
	if err := <-watched; err != nil {
		t.Errorf("WatchResourceSlices: %v", err)
	}
	if rv(t, s2.ResourceVersion) <= rv(t, s.ResourceVersion) {
		t.Errorf("resourceVersion %s after the change, was %s", s2.ResourceVersion, s.ResourceVersion)
	}
	n.waitShown(s2)

	if err := d.proc.Stop(30 * time.Second); err != nil {
		t.Fatalf("driver stop: %v", err)
	}
	n.waitDriver(testDriver, func(d *dmv1.DRADriver) error {
		if len(d.GetInstances()) != 0 || d.GetSliceDeletionTime() == nil {
			return fmt.Errorf("instances %v, slice deletion at %v", d.GetInstances(), d.GetSliceDeletionTime())
		}
		return nil
	})
	n.waitNoSlices(cs, testDriver)
	testutil.Eventually(t, "ListResourceSlices empty", func() error {
		resp, err := n.draClient().ListResourceSlices(ctxT(t), &dmv1.ListResourceSlicesRequest{DriverName: testDriver})
		if err != nil {
			return err
		}
		if len(resp.GetSlices()) != 0 {
			return fmt.Errorf("%d slices", len(resp.GetSlices()))
		}
		return nil
	})
	alive(t, n.draProcess())
}

// TestDRASlicesSurviveKills kills the dramanager and then
// nodeplug-apiserver with SIGKILL while a driver is published. The
// dramanager's kill leaves the API serving the same slice while it is
// down, and its restart deletes nothing. After the API server's restart the
// slice is the same object (UID, devices), the Node keeps its UID, the
// driver writes on through the restarted API, and the resourceVersion after
// the restart is larger than any before it.
func TestDRASlicesSurviveKills(t *testing.T) {
	n := startDRANode(t, longDelay)
	cs := n.client(n.kubeconfig())
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi")}
	d := n.startDriver(testDriver, devs)
	n.waitDriver(testDriver, oneServing(1, ""))
	before := n.waitSlices(cs, testDriver, devs)
	nodeBefore, err := cs.CoreV1().Nodes().Get(ctxT(t), n.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	n.killDRA()
	sameSlice(t, n, cs, before, devs, "with the dramanager down")
	n.startDRA()
	n.waitDriver(testDriver, oneServing(1, ""))
	sameSlice(t, n, cs, before, devs, "after the dramanager's restart")

	n.killAPI()
	n.startAPI()
	sameSlice(t, n, cs, before, devs, "after nodeplug-apiserver's restart")
	nodeAfter, err := cs.CoreV1().Nodes().Get(ctxT(t), n.node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if nodeAfter.UID != nodeBefore.UID {
		t.Errorf("Node UID %s after the restart, was %s", nodeAfter.UID, nodeBefore.UID)
	}

	// The driver kept running: its next change lands on the same slice
	// (had a restart deleted it, the helper would have made a new one).
	changed := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi"), gpu("gpu-1", "a100", 1, "40Gi")}
	d.publish(changed)
	after := n.waitSlices(cs, testDriver, changed)
	if after.UID != before.UID {
		t.Errorf("slice UID %s after the restarts and a change, was %s: the slice was deleted and made again", after.UID, before.UID)
	}
	if rv(t, after.ResourceVersion) <= rv(t, before.ResourceVersion) {
		t.Errorf("resourceVersion %s after the restarts, was %s before them", after.ResourceVersion, before.ResourceVersion)
	}
	alive(t, n.draProcess())
}

// sameSlice checks that the API lists the driver's one slice as before
// (UID, resourceVersion, devices), at a list resourceVersion not below it.
func sameSlice(t *testing.T, n *draNode, cs kubernetes.Interface, before resourcev1.ResourceSlice, devs []resourcev1.Device, when string) {
	t.Helper()
	list, err := n.slices(cs, testDriver)
	if err != nil {
		t.Fatalf("list %s: %v", when, err)
	}
	if len(list.Items) != 1 || list.Items[0].UID != before.UID || list.Items[0].ResourceVersion != before.ResourceVersion {
		t.Fatalf("%s: %+v, want the slice %s (UID %s, resourceVersion %s)", when, list.Items, before.Name, before.UID, before.ResourceVersion)
	}
	if err := sameDevices(list.Items[0].Spec.Devices, devs); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	if rv(t, list.ResourceVersion) < rv(t, before.ResourceVersion) {
		t.Errorf("list resourceVersion %s %s, below the slice's %s", list.ResourceVersion, when, before.ResourceVersion)
	}
}

// TestDRAInformerSurvivesAPIServerRestart runs a client-go informer on
// ResourceSlices against the local API through a SIGKILL and restart of
// nodeplug-apiserver: it recovers by itself (relist and watch) and sees the
// driver's later change.
func TestDRAInformerSurvivesAPIServerRestart(t *testing.T) {
	n := startDRANode(t, longDelay)
	cs := n.client(n.kubeconfig())
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi")}
	d := n.startDriver(testDriver, devs)
	n.waitSlices(cs, testDriver, devs)

	factory := informers.NewSharedInformerFactory(cs, 0)
	inf := factory.Resource().V1().ResourceSlices()
	// The lister reads the informer's store, which only its list and
	// watch fill.
	lister := inf.Lister()
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop); factory.Shutdown() })
	factory.Start(stop)
	for typ, ok := range factory.WaitForCacheSync(ctxT(t).Done()) {
		if !ok {
			t.Fatalf("informer %v did not sync", typ)
		}
	}
	informed := func(want []resourcev1.Device) func() error {
		return func() error {
			all, err := lister.List(labels.Everything())
			if err != nil {
				return err
			}
			for _, s := range all {
				if s.Spec.Driver == testDriver {
					return sameDevices(s.Spec.Devices, want)
				}
			}
			return fmt.Errorf("no slice of %s among %d", testDriver, len(all))
		}
	}
	testutil.Eventually(t, "the informer's first view", informed(devs))

	n.killAPI()
	n.startAPI()
	changed := []resourcev1.Device{gpu("gpu-0", "h100", 0, "80Gi"), gpu("gpu-1", "h100", 1, "80Gi")}
	d.publish(changed)
	testutil.Eventually(t, "the informer seeing the change made after the restart", informed(changed))
}

// TestDRARollingUpdate runs two instances of one driver at once, as the
// helper's rolling-update mode does (distinct sockets, one driver name):
// the newer serves; once it is killed the older serves again, and the
// driver's slice stays (the driver never stood without a connected
// instance) and is still the older instance's to change.
func TestDRARollingUpdate(t *testing.T) {
	n := startDRANode(t, shortDelay)
	cs := n.client(n.readerConfig())
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi")}
	sock := func(uid string) string { return filepath.Join(n.root, "plugins", testDriver, "dra-"+uid+".sock") }

	a := n.startDriver(testDriver, devs, "--rolling-update", "uid-a")
	n.waitDriver(testDriver, oneServing(1, sock("uid-a")))
	n.waitSlices(cs, testDriver, devs)

	b := n.startDriver(testDriver, devs, "--rolling-update", "uid-b")
	n.waitDriver(testDriver, oneServing(2, sock("uid-b")))
	before := n.waitSlices(cs, testDriver, devs)

	b.proc.Kill()
	// The killed instance is disconnected (or gone), the older one serves,
	// and no deletion of the driver's slices is scheduled.
	n.waitDriver(testDriver, func(d *dmv1.DRADriver) error {
		var serving *dmv1.DRADriverInstance
		for _, in := range d.GetInstances() {
			if in.GetEndpoint() == sock("uid-b") && in.GetConnected() {
				return fmt.Errorf("the killed instance is still connected: %v", in)
			}
			if in.GetServing() {
				serving = in
			}
		}
		if serving == nil || serving.GetEndpoint() != sock("uid-a") || !serving.GetConnected() {
			return fmt.Errorf("serving: %v, want the connected instance on %s", serving, sock("uid-a"))
		}
		if d.GetSliceDeletionTime() != nil {
			return fmt.Errorf("slice deletion scheduled at %v while an instance is connected", d.GetSliceDeletionTime())
		}
		return nil
	})

	changed := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi"), gpu("gpu-1", "a100", 1, "40Gi")}
	a.publish(changed)
	after := n.waitSlices(cs, testDriver, changed)
	if after.UID != before.UID {
		t.Errorf("slice UID %s after the newer instance was killed, was %s", after.UID, before.UID)
	}
	alive(t, a.proc)
}

// TestDRADriverGoneWhileDeviceManagerDown stops the driver while the
// dramanager is killed: the restarted dramanager finds the driver's
// slices of a driver no longer registered and deletes them after the delay.
func TestDRADriverGoneWhileDeviceManagerDown(t *testing.T) {
	n := startDRANode(t, shortDelay)
	cs := n.client(n.readerConfig())
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi")}
	d := n.startDriver(testDriver, devs)
	n.waitDriver(testDriver, oneServing(1, ""))
	n.waitSlices(cs, testDriver, devs)

	n.killDRA()
	if err := d.proc.Stop(30 * time.Second); err != nil {
		t.Fatalf("driver stop: %v", err)
	}
	n.startDRA()
	n.waitNoSlices(cs, testDriver)
	alive(t, n.draProcess())
}
