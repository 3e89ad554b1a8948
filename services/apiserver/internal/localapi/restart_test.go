package localapi

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

func TestInformerSurvivesRestart(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drv := clientFor(t, root, Driver)
	factory := informers.NewSharedInformerFactoryWithOptions(drv, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = resourcev1.ResourceSliceSelectorNodeName + "=" + testNode
	}))
	lister := factory.Resource().V1().ResourceSlices().Lister()
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }()
	if _, err := drv.ResourceV1().ResourceSlices().Create(ctx, slice("before", "gpu.example.com", testNode, "gpu-0"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Client.ResourceV1().ResourceSlices().Create(ctx, slice("elsewhere", "gpu.example.com", "node-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hasSlices(t, lister.List, "before")

	addr := a.Addr
	a.stop()
	b := startAPI(t, root, addr)
	if _, err := b.Client.ResourceV1().ResourceSlices().Create(ctx, slice("after", "gpu.example.com", testNode, "gpu-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Client.ResourceV1().ResourceSlices().Delete(ctx, "before", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	hasSlices(t, lister.List, "after")
}

// hasSlices waits until the lister holds exactly the named slices.
func hasSlices(t *testing.T, list func(labels.Selector) ([]*resourcev1.ResourceSlice, error), names ...string) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("the informer holding %v", names), func() error {
		got, err := list(labels.Everything())
		if err != nil {
			return err
		}
		have := map[string]bool{}
		for _, s := range got {
			have[s.Name] = true
		}
		if len(got) != len(names) {
			return fmt.Errorf("it holds %v", have)
		}
		for _, n := range names {
			if !have[n] {
				return fmt.Errorf("it holds %v", have)
			}
		}
		return nil
	})
}

func TestRestartLosesNothing(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx := context.Background()
	s, err := a.Client.ResourceV1().ResourceSlices().Create(ctx, slice("kept", "gpu.example.com", testNode, "gpu-0"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"},
		}}}},
	}
	createNamespace(t, clientFor(t, root, Operator), "ns")
	if _, err := clientFor(t, root, Operator).ResourceV1().ResourceClaims("ns").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node, err := a.Client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rvBefore := a.Local.ResourceVersion()
	a.stop()

	// Port 0 again: the port the kubeconfigs name is taken again.
	b := startAPI(t, root, "")
	if b.Addr != a.Addr {
		t.Errorf("listening on %s after a restart, the kubeconfigs name %s", b.Addr, a.Addr)
	}
	got, err := b.Client.ResourceV1().ResourceSlices().Get(ctx, "kept", metav1.GetOptions{})
	if err != nil || got.UID != s.UID || got.ResourceVersion != s.ResourceVersion || len(got.Spec.Devices) != 1 {
		t.Fatalf("after a restart: %v %v, want the slice as it was (%s at %s)", got, err, s.UID, s.ResourceVersion)
	}
	c, err := b.Client.ResourceV1().ResourceClaims("ns").Get(ctx, "c", metav1.GetOptions{})
	if err != nil || c.Spec.Devices.Requests[0].Exactly.Count != 1 || c.Spec.Devices.Requests[0].Exactly.AllocationMode != resourcev1.DeviceAllocationModeExactCount {
		t.Fatalf("claim after a restart: %v %v, want it kept with its defaults", c, err)
	}
	if n, err := b.Client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{}); err != nil || n.UID != node.UID {
		t.Fatalf("node after a restart: %v %v, want UID %s", n, err, node.UID)
	}
	if b.Local.ResourceVersion() != rvBefore {
		t.Fatalf("resourceVersion %d after a restart, was %d", b.Local.ResourceVersion(), rvBefore)
	}
	got.Labels = map[string]string{"x": "y"}
	up, err := b.Client.ResourceV1().ResourceSlices().Update(ctx, got, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := strconv.ParseUint(up.ResourceVersion, 10, 64); n <= rvBefore {
		t.Fatalf("resourceVersion %s after a restart, not above %d", up.ResourceVersion, rvBefore)
	}
	if _, err := b.Client.ResourceV1().ResourceSlices().Watch(ctx, metav1.ListOptions{ResourceVersion: s.ResourceVersion}); !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Fatalf("watch from before the restart: %v, want 410", err)
	}
}

func TestTooOldResourceVersionIsGone(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "", func(o *Options) { o.Limits.HistoryEvents = 3 })
	ctx := context.Background()
	slices := a.Client.ResourceV1().ResourceSlices()
	first, err := slices.Create(ctx, slice("s", "gpu.example.com", testNode), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur := first
	for i := range 5 {
		cur.Spec.Pool.Generation = int64(i + 2)
		if cur, err = slices.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err = slices.Watch(ctx, metav1.ListOptions{ResourceVersion: first.ResourceVersion})
	if !apierrors.IsResourceExpired(err) || apierrors.ReasonForError(err) != metav1.StatusReasonExpired {
		t.Fatalf("watch from an old resourceVersion: %v, want 410 Expired", err)
	}
	w, err := slices.Watch(ctx, metav1.ListOptions{ResourceVersion: cur.ResourceVersion})
	if err != nil {
		t.Fatalf("watch from the last resourceVersion: %v", err)
	}
	w.Stop()
	_, err = slices.List(ctx, metav1.ListOptions{ResourceVersion: first.ResourceVersion, ResourceVersionMatch: metav1.ResourceVersionMatchExact})
	if !apierrors.IsResourceExpired(err) {
		t.Fatalf("exact list at an old resourceVersion: %v, want 410", err)
	}
}

func TestNodeServed(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx := context.Background()
	list, err := a.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 || list.Items[0].Name != testNode || list.Items[0].UID == "" {
		t.Fatalf("nodes: %v %v, want only %s with a UID", list, err, testNode)
	}
	if _, err := a.Client.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("another node: %v, want 404", err)
	}
	_, err = a.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-b"}}, metav1.CreateOptions{})
	if !apierrors.IsMethodNotSupported(err) {
		t.Fatalf("creating a node: %v, want 405", err)
	}
}
