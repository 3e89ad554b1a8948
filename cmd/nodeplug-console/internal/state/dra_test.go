package state

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

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

// sliceDevices returns the devices of the slice named name in snap by
// name, or nil when it is not there.
func sliceDevices(snap Snapshot, name string) map[string]*dmv1.Device {
	i := slices.IndexFunc(snap.Slices, func(s *dmv1.ResourceSlice) bool { return s.GetName() == name })
	if i < 0 {
		return nil
	}
	out := map[string]*dmv1.Device{}
	for _, d := range snap.Slices[i].GetDevices() {
		out[d.GetName()] = d
	}
	return out
}

// TestFollowsResourceSlices runs a real nodeplug-apiserver and
// dramanager and follows the dramanager: a ResourceSlice created
// through the node-local API with the driver kubeconfig (client-go, as a
// driver writes) shows with its devices' attributes and capacity; after a
// kill -9 of the dramanager and a restart the DRA status says the stream
// went down and then synced again, and an update made after the restart
// shows; a deletion removes the slice; the driver list and the claim list
// are fetched without error.
func TestFollowsResourceSlices(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs nodeplug-apiserver and the dramanager")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := testutil.TempDir(t)
	if err := stack.Build(ctx, bin, "nodeplug-apiserver", "nodeplug-dramanager"); err != nil {
		t.Fatal(err)
	}
	root := testutil.TempDir(t)
	ps := stack.NewProcesses(bin, root)
	t.Cleanup(func() {
		ps.StopAll()
		for _, name := range []string{"apiserver", "dramanager"} {
			if p := ps.Process(name); t.Failed() && p != nil {
				t.Logf("%s log:\n%s", name, p.Logs())
			}
		}
	})
	// The node-local API first, as StartAll starts it.
	for _, name := range []string{"apiserver", "dramanager"} {
		if err := ps.Start(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	dm, err := rpcutil.DialPeer(ps.Addr("dramanager"))
	if err != nil {
		t.Fatal(err)
	}
	defer dm.Close()
	// The watcher and the reconciler are not running: their streams
	// only report them unreachable.
	absent, err := rpcutil.DialPeer(filepath.Join(root, "absent.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer absent.Close()
	st := New(Conns{Watcher: absent, Reconciler: absent, DeviceManager: absent, DRAManager: dm}, slog.New(slog.DiscardHandler))
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- st.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	var node string
	testutil.Eventually(t, "the node-local API's Node", func() error {
		cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
		defer ccancel()
		nodes, err := kubeClient(t, layout.IdentityKubeconfigFile(root, "reader")).CoreV1().Nodes().List(cctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(nodes.Items) != 1 {
			return fmt.Errorf("%d nodes, want 1", len(nodes.Items))
		}
		node = nodes.Items[0].Name
		return nil
	})
	driver := kubeClient(t, layout.KubeconfigFile(root))
	device := func(name string) resourcev1.Device {
		return resourcev1.Device{
			Name:       name,
			Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"model": {StringValue: ptr.To("m1")}},
			Capacity:   map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{"memory": {Value: apiresource.MustParse("16Gi")}},
		}
	}
	slice := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "console-state-slice"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: "gpu.state.nodeplug.test", NodeName: ptr.To(node),
			Pool:    resourcev1.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{device("gpu-0")},
		},
	}
	created, err := driver.ResourceV1().ResourceSlices().Create(ctx, slice, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create the ResourceSlice: %v", err)
	}
	testutil.Eventually(t, "the slice and its device in the state", func() error {
		snap := st.Snapshot()
		d := sliceDevices(snap, slice.Name)["gpu-0"]
		if d == nil {
			return fmt.Errorf("no gpu-0 in %v (status %q)", snap.Slices, snap.Status[DRA])
		}
		if d.GetAttributes()["model"] != "m1" || d.GetCapacity()["memory"] != "16Gi" {
			return fmt.Errorf("gpu-0: attributes %v, capacity %v", d.GetAttributes(), d.GetCapacity())
		}
		if snap.Status[DRA] != "" || snap.DriversProblem != "" || snap.ClaimsProblem != "" {
			return fmt.Errorf("DRA status %q, drivers %q, claims %q", snap.Status[DRA], snap.DriversProblem, snap.ClaimsProblem)
		}
		return nil
	})

	// kill -9: the stream goes down, and follows the restarted
	// dramanager from its new snapshot.
	ps.Kill("dramanager")
	testutil.Eventually(t, "the DRA stream reported down", func() error {
		if st.Snapshot().Status[DRA] == "" {
			return fmt.Errorf("still synced")
		}
		return nil
	})
	if err := ps.Start(ctx, "dramanager"); err != nil {
		t.Fatal(err)
	}
	created.Spec.Devices = append(created.Spec.Devices, device("gpu-1"))
	testutil.Eventually(t, "the slice updated after the restart", func() error {
		_, err := driver.ResourceV1().ResourceSlices().Update(ctx, created, metav1.UpdateOptions{})
		return err
	})
	testutil.Eventually(t, "gpu-1 in the state, synced again", func() error {
		snap := st.Snapshot()
		if devs := sliceDevices(snap, slice.Name); devs["gpu-0"] == nil || devs["gpu-1"] == nil {
			return fmt.Errorf("devices %v (status %q)", devs, snap.Status[DRA])
		}
		if snap.Status[DRA] != "" {
			return fmt.Errorf("DRA status %q", snap.Status[DRA])
		}
		return nil
	})

	if err := driver.ResourceV1().ResourceSlices().Delete(ctx, slice.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete the ResourceSlice: %v", err)
	}
	testutil.Eventually(t, "the slice gone from the state", func() error {
		if devs := sliceDevices(st.Snapshot(), slice.Name); devs != nil {
			return fmt.Errorf("still there with %d devices", len(devs))
		}
		return nil
	})
}
