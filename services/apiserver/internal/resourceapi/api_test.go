package resourceapi

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// TestValidationLimits: the annotations beyond 256 KiB, a malformed label,
// an attribute domain longer than a driver name are 422 Invalid naming the
// field; an object over 1.5 MiB is 413; a body over 3 MiB is 413 unread.
func TestValidationLimits(t *testing.T) {
	a := startAPI(t, Limits{})
	c := a.client("internal", RoleInternal).ResourceV1().ResourceSlices()
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		edit  func(*resourcev1.ResourceSlice)
		field string // 422 naming it; "": 413
	}{
		{"annotations", func(s *resourcev1.ResourceSlice) {
			s.Annotations = map[string]string{"a": strings.Repeat("x", 128<<10), "b": strings.Repeat("y", 128<<10)}
		}, "metadata.annotations"},
		{"label value", func(s *resourcev1.ResourceSlice) { s.Labels = map[string]string{"k": strings.Repeat("v", 64)} }, "metadata.labels"},
		{"label key", func(s *resourcev1.ResourceSlice) { s.Labels = map[string]string{"bad key": "v"} }, "metadata.labels"},
		{"attribute domain", func(s *resourcev1.ResourceSlice) {
			s.Spec.Devices[0].Attributes = map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
				resourcev1.QualifiedName(strings.Repeat("d", 60) + ".example.com/x"): {IntValue: ptr.To[int64](1)}}
		}, "spec.devices[0].attributes"},
		{"object size", func(s *resourcev1.ResourceSlice) {
			s.Spec.Devices[0].Taints = []resourcev1.DeviceTaint{{Key: "k", Value: strings.Repeat("x", MaxObjectBytes), Effect: resourcev1.DeviceTaintEffectNoSchedule}}
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := slice("s", "d0")
			tc.edit(s)
			_, err := c.Create(ctx, s, metav1.CreateOptions{})
			switch {
			case tc.field == "" && !apierrors.IsRequestEntityTooLargeError(err):
				t.Fatalf("%v, want 413", err)
			case tc.field != "" && (!apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.field)):
				t.Fatalf("%v, want 422 naming %s", err, tc.field)
			}
		})
	}
	cfg := a.config("internal", RoleInternal)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	body := bytes.Repeat([]byte(" "), MaxBodyBytes+1)
	resp, err := hc.Post(a.url+"/apis/resource.k8s.io/v1/resourceslices", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over %d bytes: %d, want 413", MaxBodyBytes, resp.StatusCode)
	}
}

// TestRoles: what each role may do, as client-go sees it: 403 beyond the
// role (or without one), and a driver limited to this node's slices.
func TestRoles(t *testing.T) {
	a := startAPI(t, Limits{})
	ctx := context.Background()
	other := slice("other")
	other.Spec.NodeName = ptr.To("elsewhere")
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}}
	type call func() error
	for _, tc := range []struct {
		name  string
		roles []string
		calls map[string]bool // call → allowed
	}{
		{"driver", []string{RoleDriver}, map[string]bool{"slice": true, "other node's slice": false, "class": false, "list claims": false, "get node": true}},
		{"reader", []string{RoleReader}, map[string]bool{"slice": false, "class": false, "list claims": true, "get node": true}},
		{"operator", []string{RoleOperator}, map[string]bool{"slice": false, "class": true, "list claims": true}},
		{"internal", []string{RoleInternal}, map[string]bool{"slice": true, "other node's slice": true, "class": true, "list claims": true}},
		{"no role", nil, map[string]bool{"slice": false, "list claims": false, "get node": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := a.client("u-"+strings.ReplaceAll(tc.name, " ", "-"), tc.roles...)
			rs := c.ResourceV1()
			calls := map[string]call{
				"slice": func() error {
					_, err := rs.ResourceSlices().Create(ctx, slice("s-"+tc.name), metav1.CreateOptions{})
					return err
				},
				"other node's slice": func() error {
					o := other.DeepCopy()
					o.Name = "o-" + tc.name
					_, err := rs.ResourceSlices().Create(ctx, o, metav1.CreateOptions{})
					return err
				},
				"class": func() error {
					cl := class.DeepCopy()
					cl.Name = "c-" + tc.name
					_, err := rs.DeviceClasses().Create(ctx, cl, metav1.CreateOptions{})
					return err
				},
				"list claims": func() error { _, err := rs.ResourceClaims("ns").List(ctx, metav1.ListOptions{}); return err },
				"get node":    func() error { _, err := c.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{}); return err },
			}
			for name, allowed := range tc.calls {
				err := calls[name]()
				switch {
				case allowed && err != nil:
					t.Errorf("%s: %v, want allowed", name, err)
				case !allowed && !apierrors.IsForbidden(err):
					t.Errorf("%s: %v, want 403", name, err)
				}
			}
		})
	}
}

// TestAnonymous: a client without a certificate is 401.
func TestAnonymous(t *testing.T) {
	a := startAPI(t, Limits{})
	c, err := kubernetes.NewForConfig(&rest.Config{Host: a.url, TLSClientConfig: rest.TLSClientConfig{CAData: a.ca.PEM}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("a list without a certificate: %v, want 401", err)
	}
}

// TestPatch: merge and strategic merge patches change the object; a
// resourceVersion in the patch is a precondition (409); a JSON patch is
// 415; a patch that makes the object invalid is 422.
func TestPatch(t *testing.T) {
	a := startAPI(t, Limits{})
	c := a.client("internal", RoleInternal).ResourceV1().ResourceSlices()
	ctx := context.Background()
	s, err := c.Create(ctx, slice("s", "d0"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pt    types.PatchType
		patch string
		check func(*resourcev1.ResourceSlice, error) bool
	}{
		{types.MergePatchType, `{"metadata":{"labels":{"a":"1"}}}`, func(s *resourcev1.ResourceSlice, err error) bool { return err == nil && s.Labels["a"] == "1" }},
		{types.StrategicMergePatchType, `{"metadata":{"labels":{"b":"2"}}}`, func(s *resourcev1.ResourceSlice, err error) bool {
			return err == nil && s.Labels["a"] == "1" && s.Labels["b"] == "2"
		}},
		{types.MergePatchType, `{"metadata":{"resourceVersion":"` + s.ResourceVersion + `","labels":{"c":"3"}}}`, func(_ *resourcev1.ResourceSlice, err error) bool { return apierrors.IsConflict(err) }},
		{types.JSONPatchType, `[{"op":"add","path":"/metadata/labels/d","value":"4"}]`, func(_ *resourcev1.ResourceSlice, err error) bool { return apierrors.IsUnsupportedMediaType(err) }},
		{types.MergePatchType, `{"metadata":{"labels":{"bad key":"x"}}}`, func(_ *resourcev1.ResourceSlice, err error) bool { return apierrors.IsInvalid(err) }},
		{types.MergePatchType, `{"spec":{"driver":"other.example.com"}}`, func(_ *resourcev1.ResourceSlice, err error) bool { return apierrors.IsInvalid(err) }},
	} {
		got, err := c.Patch(ctx, "s", tc.pt, []byte(tc.patch), metav1.PatchOptions{})
		if !tc.check(got, err) {
			t.Errorf("%s %s: %v %v", tc.pt, tc.patch, got.GetLabels(), err)
		}
	}
}

// TestDelete: a delete with a stale precondition is 409, with the right
// one it removes the object; a driver's deletecollection must select this
// node, and then removes only this node's slices.
func TestDelete(t *testing.T) {
	a := startAPI(t, Limits{})
	ctx := context.Background()
	internal := a.client("internal", RoleInternal).ResourceV1().ResourceSlices()
	driver := a.client("driver", RoleDriver).ResourceV1().ResourceSlices()
	s, err := internal.Create(ctx, slice("s"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	err = internal.Delete(ctx, "s", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: ptr.To(types.UID("other"))}})
	if !apierrors.IsConflict(err) {
		t.Fatalf("delete with another UID: %v, want 409", err)
	}
	if err := internal.Delete(ctx, "s", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}}); err != nil {
		t.Fatal(err)
	}
	if _, err := internal.Get(ctx, "s", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("after the delete: %v, want 404", err)
	}
	other := slice("o")
	other.Spec.NodeName = ptr.To("elsewhere")
	for _, obj := range []*resourcev1.ResourceSlice{slice("a"), slice("b"), other} {
		if _, err := internal.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := driver.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a driver's deletecollection of every node: %v, want 403", err)
	}
	sel := fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, testNode).String()
	if err := driver.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel}); err != nil {
		t.Fatal(err)
	}
	list, err := internal.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 || list.Items[0].Name != "o" {
		t.Fatalf("after the driver's deletecollection: %v %v, want only the other node's slice", list, err)
	}
}
