package localapi

import (
	"context"
	"errors"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

func TestBadInputIs400Or422(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx := context.Background()
	rc := a.Client.ResourceV1().RESTClient()
	err := rc.Post().Resource("resourceslices").SetHeader("Content-Type", "application/json").Body([]byte(`{"kind": garbage`)).Do(ctx).Error()
	if !apierrors.IsBadRequest(err) {
		t.Fatalf("garbage body: %v, want 400", err)
	}
	err = rc.Post().Resource("resourceslices").SetHeader("Content-Type", "application/json").
		Body([]byte(`{"apiVersion":"resource.k8s.io/v1","kind":"DeviceClass","metadata":{"name":"x"}}`)).Do(ctx).Error()
	if !apierrors.IsBadRequest(err) {
		t.Fatalf("a DeviceClass posted as a slice: %v, want 400", err)
	}
	bad := slice("bad", "gpu.example.com", testNode, "Not_A_Label")
	bad.Spec.Pool.ResourceSliceCount = 0
	_, err = a.Client.ResourceV1().ResourceSlices().Create(ctx, bad, metav1.CreateOptions{})
	wantCauses(t, err, "spec.devices[0].name", "spec.pool.resourceSliceCount")

	noNode := slice("no-node", "gpu.example.com", testNode)
	noNode.Spec.NodeName = nil
	_, err = a.Client.ResourceV1().ResourceSlices().Create(ctx, noNode, metav1.CreateOptions{})
	wantCauses(t, err, "spec")

	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{Name: "gpu"}}}}}
	_, err = a.Client.ResourceV1().ResourceClaims("ns").Create(ctx, claim, metav1.CreateOptions{})
	wantCauses(t, err, "spec.devices.requests[0]")

	if _, err := a.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{LabelSelector: "a in (b"}); !apierrors.IsBadRequest(err) {
		t.Fatalf("malformed label selector: %v, want 400", err)
	}
	// The server still serves after all that.
	if _, err := a.Client.ResourceV1().ResourceSlices().Create(ctx, slice("good", "gpu.example.com", testNode, "gpu-0"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// wantCauses checks err is 422 Invalid naming each field.
func wantCauses(t *testing.T, err error, fields ...string) {
	t.Helper()
	var st apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &st) || st.Status().Details == nil {
		t.Fatalf("got %v, want 422 Invalid", err)
	}
	have := map[string]bool{}
	for _, c := range st.Status().Details.Causes {
		have[c.Field] = true
	}
	for _, f := range fields {
		if !have[f] {
			t.Errorf("422 %q does not name %s (causes %v)", err, f, st.Status().Details.Causes)
		}
	}
}

func TestPatchAndDeleteCollection(t *testing.T) {
	root := testutil.TempDir(t)
	startAPI(t, root, "")
	ctx := context.Background()
	drv := clientFor(t, root, Driver).ResourceV1().ResourceSlices()
	for _, d := range []string{"a.example.com", "b.example.com"} {
		if _, err := drv.Create(ctx, slice("", d, testNode, "dev-0"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	list, _ := drv.List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=a.example.com"})
	name := list.Items[0].Name
	p, err := drv.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"merged":"yes"}}}`), metav1.PatchOptions{})
	if err != nil || p.Labels["merged"] != "yes" || p.Generation != 1 {
		t.Fatalf("merge patch: %v %v", p, err)
	}
	p, err = drv.Patch(ctx, name, types.StrategicMergePatchType, []byte(`{"spec":{"pool":{"generation":7}}}`), metav1.PatchOptions{})
	if err != nil || p.Spec.Pool.Generation != 7 || p.Spec.Pool.Name != testNode || p.Generation != 2 {
		t.Fatalf("strategic merge patch: %v %v", p, err)
	}
	_, err = drv.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"resourceVersion":"1"}}`), metav1.PatchOptions{})
	if !apierrors.IsConflict(err) {
		t.Fatalf("patch with a stale resourceVersion: %v, want 409", err)
	}
	_, err = drv.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"nodeName":"node-b"}}`), metav1.PatchOptions{})
	if !apierrors.IsInvalid(err) && !apierrors.IsForbidden(err) {
		t.Fatalf("patch moving a slice to another node: %v, want 422 or 403", err)
	}
	err = drv.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: "spec.nodeName=" + testNode + ",spec.driver=a.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	left, _ := drv.List(ctx, metav1.ListOptions{})
	if len(left.Items) != 1 || left.Items[0].Spec.Driver != "b.example.com" {
		t.Fatalf("after deleting a.example.com's slices: %v", left.Items)
	}
}

func TestClaimsAndStatus(t *testing.T) {
	root := testutil.TempDir(t)
	startAPI(t, root, "")
	ctx := context.Background()
	createNamespace(t, clientFor(t, root, Operator), "ns")
	op := clientFor(t, root, Operator).ResourceV1().ResourceClaims("ns")
	drv := clientFor(t, root, Driver).ResourceV1().ResourceClaims("ns")
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{GenerateName: "c-"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}}}}},
		Status: resourcev1.ResourceClaimStatus{ReservedFor: []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "u"}}}}
	c, err := op.Create(ctx, claim, metav1.CreateOptions{})
	if err != nil || !strings.HasPrefix(c.Name, "c-") || c.Namespace != "ns" || len(c.Status.ReservedFor) != 0 {
		t.Fatalf("create: %v %v, want a generated name in ns and no status", c, err)
	}
	got, err := drv.Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("driver get: %v", err)
	}
	got.Status.Devices = []resourcev1.AllocatedDeviceStatus{{Driver: "gpu.example.com", Pool: testNode, Device: "gpu-0"}}
	got.Labels = map[string]string{"ignored": "by a status write"}
	st, err := drv.UpdateStatus(ctx, got, metav1.UpdateOptions{})
	if err != nil || len(st.Status.Devices) != 1 || st.Labels["ignored"] != "" {
		t.Fatalf("driver status update: %v %v", st, err)
	}
	if _, err := drv.Update(ctx, st, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("driver updating a claim's spec: %v, want 403", err)
	}
	st.Spec.Devices.Requests[0].Name = "other"
	if _, err := op.Update(ctx, st, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("changing a claim's spec: %v, want 422 (immutable)", err)
	}
	all, err := clientFor(t, root, Reader).ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil || len(all.Items) != 1 {
		t.Fatalf("claims in all namespaces: %v %v", all, err)
	}
	if err := op.Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestDiscoveryAndOlderVersions(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx := context.Background()
	d := clientFor(t, root, Driver).Discovery()
	v, err := d.ServerVersion()
	if err != nil || v.Major != "1" {
		t.Fatalf("version: %v %v", v, err)
	}
	res, err := d.ServerResourcesForGroupVersion("resource.k8s.io/v1")
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, r := range res.APIResources {
		names[r.Name] = true
	}
	for _, want := range []string{"resourceslices", "resourceclaims", "resourceclaims/status", "deviceclasses"} {
		if !names[want] {
			t.Errorf("discovery lacks %s: %v", want, names)
		}
	}
	if _, err := d.ServerResourcesForGroupVersion("v1"); err != nil {
		t.Fatal(err)
	}
	for _, old := range []string{"v1beta1", "v1beta2"} {
		err := a.Client.ResourceV1().RESTClient().Get().AbsPath("/apis/resource.k8s.io", old, "resourceslices").Do(ctx).Error()
		if !apierrors.IsNotFound(err) {
			t.Fatalf("resource.k8s.io/%s: %v, want 404 as a server without it", old, err)
		}
	}
	// A NotFound from a real kind names the object: the helper's version
	// fallback tells it from an absent version only by trying the others.
	_, err = a.Client.ResourceV1().ResourceSlices().Get(ctx, "absent", metav1.GetOptions{})
	var st apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &st) || st.Status().Details.Name != "absent" {
		t.Fatalf("absent slice: %v, want 404 naming it", err)
	}
}

func TestRequestMetrics(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx := context.Background()
	if _, err := a.Client.ResourceV1().ResourceSlices().Create(ctx, slice("s", "gpu.example.com", testNode), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, _ = anonymous(t, a).ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	mfs, err := a.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"create/resourceslices/201": false, "list/resourceslices/401": false}
	for _, mf := range mfs {
		if mf.GetName() != "nodeplug_resource_api_requests_total" {
			continue
		}
		for _, m := range mf.Metric {
			want[label(m, "verb")+"/"+label(m, "resource")+"/"+label(m, "code")] = true
		}
	}
	for k, seen := range want {
		if !seen {
			t.Errorf("no request counted as %s", k)
		}
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.Label {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
