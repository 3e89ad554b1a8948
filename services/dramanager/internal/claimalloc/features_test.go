package claimalloc

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

// A prioritized list takes the first subrequest that fits.
func TestPrioritizedList(t *testing.T) {
	e := newEnv(t)
	e.slice(gpu, testNode, "a", "gpu-0", "gpu-1")
	e.class(gpu, gpu)
	r := resourcev1.DeviceRequest{Name: "gpu", FirstAvailable: []resourcev1.DeviceSubRequest{
		{Name: "big", DeviceClassName: gpu, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.attributes["gpu.example.com"].model == "h100"`}}}},
		{Name: "any", DeviceClassName: gpu, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 2},
	}}
	c, err := e.alloc.Reserve(context.Background(), pod("p"), e.claim("first", r))
	if err != nil {
		t.Fatal(err)
	}
	res := c.Status.Allocation.Devices.Results
	if len(res) != 2 || res[0].Request != "gpu/any" || res[1].Request != "gpu/any" {
		t.Fatalf("results %+v, want two devices for gpu/any", res)
	}
	// Neither fits now: the reason names both subrequests.
	_, err = e.alloc.Reserve(context.Background(), pod("q"), e.claim("second", r))
	isErr(t, "no subrequest fits", err, errdefs.ErrFailedPrecondition)
	if !strings.Contains(err.Error(), `request "gpu/big"`) || !strings.Contains(err.Error(), `request "gpu/any"`) {
		t.Fatalf("reason %q does not name the subrequests", err)
	}
}

// Admin access gets a device that is in use, and does not make it in use.
func TestAdminAccess(t *testing.T) {
	e := newEnv(t)
	e.slice(gpu, testNode, "a", "gpu-0")
	e.class(gpu, gpu)
	if _, err := e.alloc.Reserve(context.Background(), pod("p"), e.claim("user", req("gpu", gpu, 1))); err != nil {
		t.Fatal(err)
	}
	admin := req("gpu", gpu, 1)
	admin.Exactly.AdminAccess = ptr.To(true)
	c, err := e.alloc.Reserve(context.Background(), pod("monitor"), e.claim("admin", admin))
	if err != nil {
		t.Fatalf("admin access to a device in use: %v", err)
	}
	if r := c.Status.Allocation.Devices.Results; len(r) != 1 || r[0].Device != "gpu-0" || !ptr.Deref(r[0].AdminAccess, false) {
		t.Fatalf("admin result %+v", r)
	}
}

// A device tainted NoSchedule is not allocated unless the request tolerates
// the taint.
func TestDeviceTaints(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.class(gpu, gpu)
	s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "tainted"}, Spec: resourcev1.ResourceSliceSpec{
		Driver: gpu, Pool: resourcev1.ResourcePool{Name: "p", Generation: 1, ResourceSliceCount: 1}, NodeName: ptr.To(testNode),
		Devices: []resourcev1.Device{{Name: "gpu-0", Taints: []resourcev1.DeviceTaint{{Key: "example.com/broken", Effect: resourcev1.DeviceTaintEffectNoSchedule}}}},
	}}
	if _, err := e.client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := e.alloc.Reserve(ctx, pod("p"), e.claim("plain", req("gpu", gpu, 1)))
	isErr(t, "a tainted device", err, errdefs.ErrFailedPrecondition)
	if !strings.Contains(err.Error(), "1 tainted") {
		t.Fatalf("reason %q does not mention the taint", err)
	}
	tolerant := req("gpu", gpu, 1)
	tolerant.Exactly.Tolerations = []resourcev1.DeviceToleration{{Key: "example.com/broken", Operator: resourcev1.DeviceTolerationOpExists}}
	c, err := e.alloc.Reserve(ctx, pod("p"), e.claim("tolerant", tolerant))
	if err != nil || !slices.Equal(devicesOf(c), []string{gpu + "/p/gpu-0"}) {
		t.Fatalf("a request tolerating the taint: %v %v", c, err)
	}
}

// Slices not bound to the node by name: allNodes and a node selector
// matching this node's labels count; a selector for another node does not.
func TestSlicesForAllNodesAndBySelector(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.class(nic, nic)
	hostname := func(node string) *corev1.NodeSelector {
		return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{
			Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}
	}
	for _, s := range []struct {
		pool string
		spec func(*resourcev1.ResourceSliceSpec)
	}{
		{"everywhere", func(s *resourcev1.ResourceSliceSpec) { s.AllNodes = ptr.To(true) }},
		{"here", func(s *resourcev1.ResourceSliceSpec) { s.NodeSelector = hostname(testNode) }},
		{"there", func(s *resourcev1.ResourceSliceSpec) { s.NodeSelector = hostname("node-b") }},
	} {
		sl := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: s.pool}, Spec: resourcev1.ResourceSliceSpec{
			Driver: nic, Pool: resourcev1.ResourcePool{Name: s.pool, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "nic-0"}},
		}}
		s.spec(&sl.Spec)
		if _, err := e.client.ResourceV1().ResourceSlices().Create(ctx, sl, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := e.alloc.Reserve(ctx, pod("p"), e.claim("nics", req("nics", nic, 0)))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := devicesOf(c), []string{nic + "/everywhere/nic-0", nic + "/here/nic-0"}; !slices.Equal(got, want) {
		t.Fatalf("devices %v, want %v", got, want)
	}
	// Reserving it again checks the allocation's node selector against
	// this node.
	if _, err := e.alloc.Reserve(ctx, pod("q"), claims.ClaimRef{Namespace: c.Namespace, Name: c.Name}); err != nil {
		t.Fatal(err)
	}
}

// A marker left without an allocation (a status write that failed after
// it) is removed by Unreserve and rewritten by the next allocation.
func TestStaleMarker(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.slice(gpu, testNode, "a", "gpu-0")
	e.class(gpu, gpu)
	ref := e.claim("c", req("gpu", gpu, 1))
	c := e.get(ref)
	c.Annotations = map[string]string{AllocatedByAnnotation: testNode}
	if _, err := e.client.ResourceV1().ResourceClaims(ref.Namespace).Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.alloc.Unreserve(ctx, pod("p"), ref); err != nil {
		t.Fatal(err)
	}
	if c := e.get(ref); c.Annotations[AllocatedByAnnotation] != "" {
		t.Fatalf("marker %v left", c.Annotations)
	}
	c, err := e.alloc.Reserve(ctx, pod("p"), ref)
	if err != nil || c.Annotations[AllocatedByAnnotation] != testNode || c.Status.Allocation == nil {
		t.Fatalf("allocation after the stale marker: %v %v", c, err)
	}
}
