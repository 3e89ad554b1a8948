package claimalloc

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/apiserver/apiservertest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

const (
	testNode = "node-a"
	gpu      = "gpu.example.com"
	nic      = "nic.example.com"
)

// env is the node-local API served for a test, as the dramanager serves
// it, with its client and an Allocator over it.
type env struct {
	t      *testing.T
	client kubernetes.Interface
	alloc  *Allocator
	stop   func()
}

// newEnv is an env whose Allocator runs its informers (Run, synced).
func newEnv(t *testing.T) *env { return newEnvWith(t, true) }

// newEnvWith is an env whose Allocator runs its informers when follow is
// set, else lists from the API for each decision.
func newEnvWith(t *testing.T, follow bool) *env {
	t.Helper()
	a := startAPI(t, testutil.TempDir(t))
	stop := a.Stop
	al, err := New(a.Client, a.NodeName, nil)
	if err != nil {
		t.Fatal(err)
	}
	if follow {
		runAllocator(t, al)
	}
	return &env{t: t, client: a.Client, alloc: al, stop: stop}
}

// startAPI serves the node-local API of root with the namespace the
// tests' claims are in, labelled for admin access to devices.
func startAPI(t *testing.T, root string) *apiservertest.Server {
	t.Helper()
	a := apiservertest.Start(t, root, testNode)
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ns",
		Labels: map[string]string{resourcev1.DRAAdminNamespaceLabelKey: "true"}}}
	if _, err := a.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return a
}

// runAllocator runs al's informers until the test ends (before the API
// stops) and waits for them to sync.
func runAllocator(t *testing.T, al *Allocator) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- al.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	testutil.WaitFor(t, "the allocator's informers synced", func() bool { return al.cached.Load() != nil })
}

// slice publishes devices of driver on node; each device has the
// attributes index (its position) and model.
func (e *env) slice(driver, node, model string, devices ...string) {
	e.t.Helper()
	s := &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: node + "-" + driver + "-"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			Pool:     resourcev1.ResourcePool{Name: node + "-" + model, Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To(node),
		},
	}
	for i, d := range devices {
		s.Spec.Devices = append(s.Spec.Devices, resourcev1.Device{Name: d, Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
			"index": {IntValue: ptr.To(int64(i))}, "model": {StringValue: ptr.To(model)},
		}})
	}
	if _, err := e.client.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// class creates a DeviceClass selecting the devices of driver.
func (e *env) class(name, driver string) {
	e.t.Helper()
	c := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.DeviceClassSpec{
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + driver + `"`}}},
	}}
	if _, err := e.client.ResourceV1().DeviceClasses().Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// viewed waits until the allocator's informers hold every ResourceSlice of
// the node and every DeviceClass the API holds, so that the next decision
// is made from them: one made before they see a slice or class just
// created is made again from the API, as it should be, which a test of
// the informers' decisions does not count on.
func (e *env) viewed() {
	e.t.Helper()
	ctx := context.Background()
	sl, err := e.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	nodeSlices := 0
	for _, s := range sl.Items {
		if ptr.Deref(s.Spec.NodeName, "") == testNode {
			nodeSlices++
		}
	}
	cl, err := e.client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	testutil.WaitFor(e.t, "the allocator's informers hold the node's slices and the classes", func() bool {
		c := e.alloc.cached.Load()
		return c != nil && len(c.nodeSlices.List()) == nodeSlices && len(c.classes.List()) == len(cl.Items)
	})
}

// claim creates a claim in ns "ns" with the requests.
func (e *env) claim(name string, reqs ...resourcev1.DeviceRequest) claims.ClaimRef {
	e.t.Helper()
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: reqs}}}
	c, err := e.client.ResourceV1().ResourceClaims("ns").Create(context.Background(), c, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return claims.ClaimRef{Namespace: c.Namespace, Name: c.Name, UID: string(c.UID)}
}

func (e *env) get(ref claims.ClaimRef) *resourcev1.ResourceClaim {
	e.t.Helper()
	c, err := e.client.ResourceV1().ResourceClaims(ref.Namespace).Get(context.Background(), ref.Name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// req asks for count devices of class (mode All when count is 0),
// with optional CEL selectors.
func req(name, class string, count int64, selectors ...string) resourcev1.DeviceRequest {
	r := resourcev1.DeviceRequest{Name: name, Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class,
		AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: count}}
	if count == 0 {
		r.Exactly.AllocationMode, r.Exactly.Count = resourcev1.DeviceAllocationModeAll, 0
	}
	for _, s := range selectors {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourcev1.DeviceSelector{CEL: &resourcev1.CELDeviceSelector{Expression: s}})
	}
	return r
}

func pod(n string) claims.PodRef {
	return claims.PodRef{UID: "uid-" + n, Namespace: "ns", Name: n}
}

// devicesOf are the allocated devices of a claim ("driver/pool/device").
func devicesOf(c *resourcev1.ResourceClaim) []string {
	if c.Status.Allocation == nil {
		return nil
	}
	return deviceNames(c.Status.Allocation)
}

// reservedPods are the pod UIDs in a claim's reservedFor.
func reservedPods(c *resourcev1.ResourceClaim) []string {
	var out []string
	for _, r := range c.Status.ReservedFor {
		if r.Resource != "pods" {
			continue
		}
		out = append(out, string(r.UID))
	}
	return out
}

// forNode is an allocation result a scheduler would write for node.
func forNode(node string, devices ...string) *resourcev1.AllocationResult {
	r := &resourcev1.AllocationResult{NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}}
	for _, d := range devices {
		r.Devices.Results = append(r.Devices.Results, resourcev1.DeviceRequestAllocationResult{
			Request: "gpu", Driver: gpu, Pool: node + "-a", Device: d})
	}
	return r
}

// isErr fails unless err wraps want.
func isErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: %v, want %v", what, err, want)
	}
}
