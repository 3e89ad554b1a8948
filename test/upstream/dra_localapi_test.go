package upstream

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// testSlice is a valid slice of driver on node with one device.
func testSlice(driver, node string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"},
		Spec: resourcev1.ResourceSliceSpec{
			Driver:   driver,
			NodeName: &node,
			Pool:     resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices:  []resourcev1.Device{gpu("dev-0", "a100", 0, "40Gi")},
		},
	}
}

// TestDRALocalAPIConflict: an update or a delete that names a
// resourceVersion (or UID) the slice no longer has gets 409 Conflict, as
// from a real API server, and leaves the slice as it was.
func TestDRALocalAPIConflict(t *testing.T) {
	n := startDRANode(t, longDelay)
	cs := n.client(n.kubeconfig())
	sc := cs.ResourceV1().ResourceSlices()
	created, err := sc.Create(ctxT(t), testSlice("conflict.nodeplug.test", n.node), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if !strings.HasPrefix(created.Name, "test-") || len(created.Name) == len("test-") {
		t.Errorf("generateName test- made the name %q", created.Name)
	}

	stale := created.DeepCopy()
	fresh := created.DeepCopy()
	fresh.Spec.Devices = append(fresh.Spec.Devices, gpu("dev-1", "a100", 1, "40Gi"))
	updated, err := sc.Update(ctxT(t), fresh, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update at the current resourceVersion: %v", err)
	}
	if rv(t, updated.ResourceVersion) <= rv(t, created.ResourceVersion) {
		t.Errorf("resourceVersion %s after the update, was %s", updated.ResourceVersion, created.ResourceVersion)
	}

	stale.Spec.Devices = nil
	if _, err := sc.Update(ctxT(t), stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("update at the stale resourceVersion %s: %v, want 409 Conflict", stale.ResourceVersion, err)
	}
	oldRV := created.ResourceVersion
	if err := sc.Delete(ctxT(t), created.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &oldRV}}); !apierrors.IsConflict(err) {
		t.Errorf("delete with the stale resourceVersion %s: %v, want 409 Conflict", oldRV, err)
	}
	otherUID := created.UID + "x"
	if err := sc.Delete(ctxT(t), created.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &otherUID}}); !apierrors.IsConflict(err) {
		t.Errorf("delete with another UID: %v, want 409 Conflict", err)
	}
	got, err := sc.Get(ctxT(t), created.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get after the refused writes: %v", err)
	}
	if got.ResourceVersion != updated.ResourceVersion || len(got.Spec.Devices) != 2 {
		t.Errorf("after the refused writes: resourceVersion %s with %d devices, want %s with 2", got.ResourceVersion, len(got.Spec.Devices), updated.ResourceVersion)
	}
	cur := got.ResourceVersion
	if err := sc.Delete(ctxT(t), created.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &got.UID, ResourceVersion: &cur}}); err != nil {
		t.Errorf("delete with the current UID and resourceVersion: %v", err)
	}
}

// TestDRALocalAPIForbidden: the driver's kubeconfig writes only slices of
// this node (another node's, or moving one away, is 403 Forbidden with the
// Status a client expects) and no DeviceClass; a request with no client
// certificate is 401.
func TestDRALocalAPIForbidden(t *testing.T) {
	n := startDRANode(t, longDelay)
	cfg := n.restConfig(n.kubeconfig())
	cs := n.client(n.kubeconfig())
	sc := cs.ResourceV1().ResourceSlices()

	_, err := sc.Create(ctxT(t), testSlice("forbidden.nodeplug.test", "other-node"), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("create a slice of another node: %v, want 403 Forbidden", err)
	}
	var st apierrors.APIStatus
	if se, ok := err.(apierrors.APIStatus); ok {
		st = se
	}
	if st == nil || st.Status().Details == nil || st.Status().Details.Kind != "resourceslices" || st.Status().Details.Group != resourcev1.GroupName {
		t.Errorf("403 Status details: %+v, want kind resourceslices of group %s", st, resourcev1.GroupName)
	}

	own, err := sc.Create(ctxT(t), testSlice("forbidden.nodeplug.test", n.node), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create a slice of this node: %v", err)
	}
	moved := own.DeepCopy()
	other := "other-node"
	moved.Spec.NodeName = &other
	moved.Spec.Pool.Name = other
	// spec.nodeName is immutable too, so 422 refuses the move as well as
	// 403 (a real server's node restriction comes first, with 403).
	if _, err := sc.Update(ctxT(t), moved, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) {
		t.Errorf("move this node's slice to another node: %v, want 403 Forbidden or 422 Invalid", err)
	}
	all := own.DeepCopy()
	all.Name, all.ResourceVersion, all.UID = "", "", ""
	all.Spec.NodeName, all.Spec.AllNodes = nil, new(bool)
	*all.Spec.AllNodes = true
	if _, err := sc.Create(ctxT(t), all, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("create a slice for all nodes: %v, want 403 Forbidden", err)
	}
	reader := n.client(n.readerConfig())
	if _, err := reader.ResourceV1().ResourceSlices().Create(ctxT(t), testSlice("forbidden.nodeplug.test", n.node), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the reader creating a slice: %v, want 403 Forbidden", err)
	}
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.nodeplug.test"}}
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctxT(t), class, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("a driver creating a DeviceClass: %v, want 403 Forbidden", err)
	}
	if got, err := sc.Get(ctxT(t), own.Name, metav1.GetOptions{}); err != nil || *got.Spec.NodeName != n.node {
		t.Errorf("this node's slice after the refused move: %v, %v", got, err)
	}

	// No client certificate: trusted server, anonymous caller.
	anon := rest.AnonymousClientConfig(cfg)
	hc, err := rest.HTTPClientFor(anon)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Get(cfg.Host + "/apis/resource.k8s.io/v1/resourceslices")
	if err != nil {
		// A server that demands a certificate in the handshake refuses
		// here instead; the contract is a 401 Status.
		t.Fatalf("anonymous list: %v, want 401", err)
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("anonymous list: %d %s, want 401", resp.StatusCode, body)
	}
}

// TestDRALocalAPIBadInput sends what no client should: bodies that are not
// JSON, JSON of the wrong shape or kind, objects that fail validation,
// selectors that do not parse, a body over the limit. Each gets a 4xx
// Status (422 naming the bad fields for invalid objects), nothing is
// stored, nodeplug-apiserver serves on (the same process), and so does the
// dramanager, on its gRPC API.
func TestDRALocalAPIBadInput(t *testing.T) {
	n := startDRANode(t, longDelay)
	cfg := n.restConfig(n.kubeconfig())
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pid := n.apiProcess().Cmd.Process.Pid
	base := cfg.Host + "/apis/resource.k8s.io/v1/resourceslices"

	invalid := testSlice("", n.node)
	invalid.Spec.Devices = append(invalid.Spec.Devices, resourcev1.Device{Name: "Not_A_Label"})
	invalidJSON, err := json.Marshal(invalid)
	if err != nil {
		t.Fatal(err)
	}
	invalid.Kind, invalid.APIVersion = "ResourceSlice", "resource.k8s.io/v1"
	typedJSON, _ := json.Marshal(invalid)
	cases := []struct {
		name, method, url, body string
		codes                   []int
		fields                  []string // 422: the field paths named
	}{
		{"not JSON", http.MethodPost, base, "{{{ not json", []int{400}, nil},
		{"binary", http.MethodPost, base, "\x00\xff\xfe\x01garbage", []int{400}, nil},
		{"spec of the wrong type", http.MethodPost, base, `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","spec":"x"}`, []int{400}, nil},
		{"another kind", http.MethodPost, base, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}`, []int{400}, nil},
		{"invalid slice", http.MethodPost, base, string(invalidJSON), []int{422}, []string{"spec.driver", "spec.devices[1].name"}},
		{"invalid slice with its kind", http.MethodPost, base, string(typedJSON), []int{422}, []string{"spec.driver", "spec.devices[1].name"}},
		{"empty body", http.MethodPost, base, "", []int{400}, nil},
		{"update of garbage", http.MethodPut, base + "/no-such-slice", "]]", []int{400}, nil},
		{"bad field selector", http.MethodGet, base + "?fieldSelector=spec.driver%3D%3D%3Dx%2C%2C", "", []int{400}, nil},
		{"unknown field selector", http.MethodGet, base + "?fieldSelector=metadata.nosuchfield%3Dx", "", []int{400}, nil},
		{"body over the limit", http.MethodPost, base, `{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice","metadata":{"name":"` + strings.Repeat("a", 4<<20) + `"}}`, []int{400, 413, 422}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(ctxT(t), c.method, c.url, bytes.NewReader([]byte(c.body)))
			if err != nil {
				t.Fatal(err)
			}
			if c.body != "" {
				req.Header.Set("Content-Type", "application/json")
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", c.method, c.url, err)
			}
			data, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if !slices.Contains(c.codes, resp.StatusCode) {
				t.Fatalf("got %d %.300s, want %v", resp.StatusCode, data, c.codes)
			}
			var st metav1.Status
			if err := json.Unmarshal(data, &st); err != nil || st.Kind != "Status" || int(st.Code) != resp.StatusCode || st.Message == "" {
				t.Fatalf("body is not a Status with code and message (%v): %.300s", err, data)
			}
			for _, f := range c.fields {
				found := false
				if st.Details != nil {
					for _, cause := range st.Details.Causes {
						found = found || cause.Field == f
					}
				}
				if !found {
					t.Errorf("422 names no cause for field %s: %+v", f, st.Details)
				}
			}
		})
	}

	alive(t, n.apiProcess())
	if got := n.apiProcess().Cmd.Process.Pid; got != pid {
		t.Fatalf("nodeplug-apiserver pid %d, was %d", got, pid)
	}
	alive(t, n.draProcess())
	cs := n.client(n.kubeconfig())
	list, err := cs.ResourceV1().ResourceSlices().List(ctxT(t), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list after the bad requests: %v", err)
	}
	if len(list.Items) != 0 {
		t.Errorf("bad requests stored %d slices: %v", len(list.Items), list.Items)
	}
	if _, err := cs.ResourceV1().ResourceSlices().Create(ctxT(t), testSlice("good.nodeplug.test", n.node), metav1.CreateOptions{}); err != nil {
		t.Errorf("a good create after the bad requests: %v", err)
	}
	dmGRPCServing(t, n)
}

// dmGRPCServing checks that the dramanager answers on its gRPC socket.
func dmGRPCServing(t *testing.T, n *draNode) {
	t.Helper()
	conn, err := rpcutil.DialPeer(n.dmp.Addr("dramanager"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := dmv1.NewDRAServiceClient(conn).ListDRADrivers(ctxT(t), &dmv1.ListDRADriversRequest{}); err != nil {
		t.Errorf("dramanager gRPC after the bad requests: %v", err)
	}
}
