package claimalloc

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// createSlice creates s on the node-local API.
func (e *env) createSlice(s *resourcev1.ResourceSlice) {
	e.t.Helper()
	if _, err := e.client.ResourceV1().ResourceSlices().Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// refused reserves a claim named name with r for a pod and checks that it
// is refused with every one of want in the reason.
func (e *env) refused(name string, r resourcev1.DeviceRequest, want ...string) {
	e.t.Helper()
	_, err := e.alloc.Reserve(context.Background(), pod(name), e.claim(name, r))
	isErr(e.t, name, err, errdefs.ErrFailedPrecondition)
	e.t.Logf("%s: %v", name, err)
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			e.t.Errorf("reason %q lacks %q", err, w)
		}
	}
}

// A refusal for exhausted shared counters names the counter set, its
// pool, the counter, what is left of it and what a device needs.
func TestExplainSharedCounters(t *testing.T) {
	e := newEnv(t)
	pool := resourcev1.ResourcePool{Name: "gpu-0", Generation: 1, ResourceSliceCount: 2}
	gi := func(n string) resourcev1.Counter { return resourcev1.Counter{Value: apiresource.MustParse(n)} }
	e.createSlice(&resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "gpu-0-counters"}, Spec: resourcev1.ResourceSliceSpec{
		Driver: gpu, Pool: pool, NodeName: ptr.To(testNode),
		SharedCounters: []resourcev1.CounterSet{{Name: "gpu-0-memory", Counters: map[string]resourcev1.Counter{"memory": gi("40Gi")}}},
	}})
	var parts []resourcev1.Device
	for _, n := range []string{"part-0", "part-1", "part-2", "part-3"} {
		parts = append(parts, resourcev1.Device{Name: n, ConsumesCounters: []resourcev1.DeviceCounterConsumption{{
			CounterSet: "gpu-0-memory", Counters: map[string]resourcev1.Counter{"memory": gi("20Gi")}}}})
	}
	e.createSlice(&resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "gpu-0-parts"}, Spec: resourcev1.ResourceSliceSpec{
		Driver: gpu, Pool: pool, NodeName: ptr.To(testNode), Devices: parts,
	}})
	e.class(gpu, gpu)
	for _, n := range []string{"a", "b"} {
		if _, err := e.alloc.Reserve(context.Background(), pod(n), e.claim(n, req("gpu", gpu, 1))); err != nil {
			t.Fatalf("claim %s: %v", n, err)
		}
	}
	e.refused("c", req("gpu", gpu, 1), "4 of the node's 4 device(s) match", "2 of them free",
		`2 of the free ones left short: shared counter set "gpu-0-memory" of pool "gpu-0" has 0 of counter "memory" left (of 40Gi), a device needs 20Gi`)
}

// A refusal for shared capacity names the device and the capacity, what
// its shares use and what the request needs; one the request policy
// refuses, or one the device lacks, is named too.
func TestExplainSharedCapacity(t *testing.T) {
	e := newEnv(t)
	q := apiresource.MustParse
	e.createSlice(&resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "nics"}, Spec: resourcev1.ResourceSliceSpec{
		Driver: nic, Pool: resourcev1.ResourcePool{Name: "p", Generation: 1, ResourceSliceCount: 1}, NodeName: ptr.To(testNode),
		Devices: []resourcev1.Device{{Name: "nic-0", AllowMultipleAllocations: ptr.To(true), Capacity: map[resourcev1.QualifiedName]resourcev1.DeviceCapacity{
			"bandwidth": {Value: q("10Gi"), RequestPolicy: &resourcev1.CapacityRequestPolicy{Default: ptr.To(q("1Gi")),
				ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: ptr.To(q("1Gi")), Max: ptr.To(q("8Gi"))}}},
		}}},
	}})
	e.class(nic, nic)
	bandwidth := func(amount string) resourcev1.DeviceRequest {
		r := req("nic", nic, 1)
		r.Exactly.Capacity = &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]apiresource.Quantity{"bandwidth": q(amount)}}
		return r
	}
	if _, err := e.alloc.Reserve(context.Background(), pod("a"), e.claim("a", bandwidth("6Gi"))); err != nil {
		t.Fatal(err)
	}
	e.refused("b", bandwidth("6Gi"), "1 of them free",
		`1 of the free ones left short: capacity "bandwidth" of device nic.example.com/p/nic-0: 6Gi of 10Gi in use, the request needs 6Gi`)
	e.refused("c", bandwidth("12Gi"), `capacity "bandwidth" of device nic.example.com/p/nic-0: 12Gi is above the most its request policy allows, 8Gi`)
	lacking := req("nic", nic, 1)
	lacking.Exactly.Capacity = &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]apiresource.Quantity{"lanes": q("2")}}
	e.refused("d", lacking, `device nic.example.com/p/nic-0 has no capacity "lanes"`)
}

// An admin-access request that finds too few devices says that admin
// access takes devices in use as free (its namespace carries the label
// admin access requires).
func TestExplainAdminAccess(t *testing.T) {
	e := newEnv(t)
	e.slice(gpu, testNode, "a", "gpu-0")
	e.class(gpu, gpu)
	admin := req("gpu", gpu, 2)
	admin.Exactly.AdminAccess = ptr.To(true)
	e.refused("monitor", admin, "2 device(s) with admin access", "1 of the node's 1 device(s) match", "with admin access a device in use counts as free")
	if _, err := e.alloc.Reserve(context.Background(), pod("m"), e.claim("m", req("gpu", gpu, 1))); err != nil {
		t.Fatal(err)
	}
}

// Where the API serves namespaces (a cluster's), admin access is named
// as refused for a namespace without the label
// resource.kubernetes.io/admin-access=true, and not for one with it.
func TestAdminAccessNamespaceLabel(t *testing.T) {
	labelled := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ops", Labels: map[string]string{resourcev1.DRAAdminNamespaceLabelKey: "true"}}}
	plain := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team"}}
	a, err := New(fake.NewClientset(labelled, plain), testNode, nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := req("gpu", gpu, 1)
	admin.Exactly.AdminAccess = ptr.To(true)
	claimIn := func(ns string, r resourcev1.DeviceRequest) *resourcev1.ResourceClaim {
		return &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "c"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{r}}}}
	}
	ctx := context.Background()
	want := `admin access: namespace "team" lacks the label resource.kubernetes.io/admin-access=true`
	if got := a.adminAccessRefusal(ctx, claimIn("team", admin)); !strings.HasPrefix(got, want) {
		t.Errorf("unlabelled namespace: %q, want %q", got, want)
	}
	for _, tc := range []struct {
		name  string
		claim *resourcev1.ResourceClaim
	}{
		{"labelled namespace", claimIn("ops", admin)},
		{"no admin access", claimIn("team", req("gpu", gpu, 1))},
		{"namespace not served", claimIn("gone", admin)},
	} {
		if got := a.adminAccessRefusal(ctx, tc.claim); got != "" {
			t.Errorf("%s: %q, want none", tc.name, got)
		}
	}
}
