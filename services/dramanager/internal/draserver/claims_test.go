package draserver_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimview"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

const gpu = "gpu.example.com"

// startClaims is the service with the real claims manager: the journal
// under a temporary dra-manager directory, loaded as the dramanager loads
// it, claimalloc reserving against the node-local API and the registry calling
// the drivers.
func startClaims(t *testing.T) *env {
	t.Helper()
	return startWith(t, 0, func(reg *drivers.Registry, api *dratest.API) claimview.Records {
		dir := filepath.Join(api.Root, "dra-manager")
		if err := os.MkdirAll(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		j := claims.NewJournal(store.New(dir, store.Options{}))
		if _, err := j.Load(); err != nil {
			t.Fatal(err)
		}
		res, err := claimalloc.New(api.Client, dratest.Node, nil)
		if err != nil {
			t.Fatal(err)
		}
		m, err := claims.New(claims.Config{Reserver: res, Drivers: reg, Journal: j, AllocatedHere: func(c *resourcev1.ResourceClaim) bool {
			return c.Annotations[claimalloc.AllocatedByAnnotation] == dratest.Node
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			m.Close()
			if err := j.Flush(); err != nil {
				t.Error(err)
			}
		})
		return m
	})
}

// pendingClaim creates the claim default/name of one device of class.
func (e *env) pendingClaim(t *testing.T, name, class string) {
	t.Helper()
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}}
	c.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class}}}
	if _, err := e.api.Client.ResourceV1().ResourceClaims("default").Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) listClaims(t *testing.T) map[string]*dmv1.Claim {
	t.Helper()
	resp, err := e.client.ListClaims(context.Background(), &dmv1.ListClaimsRequest{})
	if err != nil {
		t.Fatalf("ListClaims: %v", err)
	}
	out := map[string]*dmv1.Claim{}
	for _, c := range resp.GetClaims() {
		out[c.GetNamespace()+"/"+c.GetName()] = c
	}
	return out
}

func podRequest(pod, claim string) *dmv1.PrepareResourcesRequest {
	return &dmv1.PrepareResourcesRequest{
		PodUid: "uid-" + pod, PodNamespace: "default", PodName: pod,
		PodClaims:  []*dmv1.PodClaim{{Name: "c", ResourceClaimName: claim}},
		Containers: []*dmv1.ContainerClaims{{Name: "main", Claims: []*dmv1.ContainerClaim{{Name: "c"}}}, {Name: "sidecar"}},
	}
}

// A pending claim is allocated and prepared for a pod through
// PrepareResources; ListClaims shows it pending, then prepared with its
// device, the device's health, the pod and the CDI IDs; ListResourceSlices
// shows the health too. A driver's error fails the prepare and shows the
// claim as failed, with the driver's message.
func TestPrepareResourcesAndListClaims(t *testing.T) {
	e := startClaims(t)
	ctx := context.Background()
	p := dratest.NewPlugin(gpu)
	var health []kubeletplugin.DeviceHealth
	for i := range 2 {
		health = append(health, kubeletplugin.DeviceHealth{PoolName: dratest.Node, DeviceName: fmt.Sprintf("dev-%d", i),
			Health: kubeletplugin.HealthStatusUnhealthy, Message: fmt.Sprintf("fan %d stopped", i)})
	}
	p.SetHealth(health...)
	d := dratest.StartDriverWith(t, e.api, gpu, "", p)
	e.register(t, d)
	d.Publish(t, 2)
	dratest.WaitSlices(t, e.api.Client, gpu, 1, 2)
	class := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "class"}, Spec: resourcev1.DeviceClassSpec{
		Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + gpu + `"`}}},
	}}
	if _, err := e.api.Client.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.pendingClaim(t, "a", "class")
	if c := e.listClaims(t)["default/a"]; c.GetState() != dmv1.ClaimState_CLAIM_STATE_PENDING || len(c.GetDevices()) != 0 {
		t.Fatalf("claim a before prepare: %v, want pending without devices", c)
	}
	testutil.Eventually(t, "the driver's health seen", func() error {
		if h, _ := e.reg.Health(gpu, dratest.Node, "dev-1"); h != drivers.HealthUnhealthy {
			return fmt.Errorf("health of dev-1 = %q", h)
		}
		return nil
	})

	resp, err := e.client.PrepareResources(ctx, podRequest("p1", "a"))
	if err != nil {
		t.Fatalf("PrepareResources: %v", err)
	}
	if len(resp.GetContainers()) != 2 || resp.GetContainers()[0].GetName() != "main" || len(resp.GetContainers()[1].GetCdiDeviceIds()) != 0 {
		t.Fatalf("containers = %v, want main with the claim's CDI IDs and sidecar with none", resp.GetContainers())
	}
	main := resp.GetContainers()[0]
	if len(main.GetDevices()) != 1 {
		t.Fatalf("main's devices = %v, want one", main.GetDevices())
	}
	dev := main.GetDevices()[0]
	wantID := dratest.CDIID(types.UID(dev.GetClaimUid()), dev.GetDevice())
	if !slices.Equal(main.GetCdiDeviceIds(), []string{wantID}) || dev.GetClaimName() != "a" || dev.GetClaimNamespace() != "default" ||
		dev.GetDriver() != gpu || dev.GetPool() != dratest.Node || !slices.Equal(dev.GetRequests(), []string{"gpu"}) {
		t.Errorf("main = %v, want claim default/a's device with CDI ID %s", main, wantID)
	}

	c := e.listClaims(t)["default/a"]
	if c.GetState() != dmv1.ClaimState_CLAIM_STATE_PREPARED || !c.GetAllocatedHere() || c.GetAllocatedNode() != dratest.Node ||
		!slices.Equal(c.GetCdiDeviceIds(), []string{wantID}) || c.GetUid() != dev.GetClaimUid() {
		t.Errorf("claim a after prepare: %v, want prepared here on %s with %s", c, dratest.Node, wantID)
	}
	if len(c.GetPods()) != 1 || c.GetPods()[0].GetUid() != "uid-p1" || c.GetPods()[0].GetName() != "p1" {
		t.Errorf("pods of claim a = %v, want p1", c.GetPods())
	}
	if len(c.GetDevices()) != 1 || c.GetDevices()[0].GetHealth() != drivers.HealthUnhealthy ||
		!strings.HasPrefix(c.GetDevices()[0].GetHealthMessage(), "fan ") {
		t.Errorf("devices of claim a = %v, want one, unhealthy with the driver's message", c.GetDevices())
	}

	sl, err := e.client.ListResourceSlices(ctx, &dmv1.ListResourceSlicesRequest{})
	if err != nil || len(sl.GetSlices()) != 1 {
		t.Fatalf("ListResourceSlices = %v, %v", sl, err)
	}
	for _, d := range sl.GetSlices()[0].GetDevices() {
		if d.GetHealth() != drivers.HealthUnhealthy || !strings.HasPrefix(d.GetHealthMessage(), "fan ") {
			t.Errorf("slice device %s: health %q %q, want the driver's", d.GetName(), d.GetHealth(), d.GetHealthMessage())
		}
	}

	e.pendingClaim(t, "b", "class")
	p.Fail("b", "the device is on fire")
	_, err = e.client.PrepareResources(ctx, podRequest("p2", "b"))
	if err == nil || !strings.Contains(err.Error(), "the device is on fire") {
		t.Fatalf("PrepareResources with a failing driver: %v, want the driver's message", err)
	}
	b := e.listClaims(t)["default/b"]
	if b.GetState() != dmv1.ClaimState_CLAIM_STATE_FAILED || !strings.Contains(b.GetReason(), "the device is on fire") {
		t.Errorf("claim b after the failed prepare: %v, want failed with the driver's message", b)
	}
	bad := podRequest("p3", "b")
	bad.PodUid = ""
	if _, err := e.client.PrepareResources(ctx, bad); status.Code(err) != codes.InvalidArgument {
		t.Errorf("PrepareResources without a pod UID: %v, want INVALID_ARGUMENT", err)
	}
	bad = podRequest("p3", "b")
	bad.Containers[0].Claims[0].Name = "nosuch"
	if _, err := e.client.PrepareResources(ctx, bad); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("PrepareResources with a container naming no pod claim: %v, want INVALID_ARGUMENT naming it", err)
	}
	p.Fail("b", "")
	if _, err := e.client.PrepareResources(ctx, podRequest("p2", "b")); err != nil {
		t.Fatalf("PrepareResources again: %v", err)
	}
	if b := e.listClaims(t)["default/b"]; b.GetState() != dmv1.ClaimState_CLAIM_STATE_PREPARED || b.GetReason() != "" {
		t.Errorf("claim b after the retry: %v, want prepared", b)
	}
}

// Without a claims manager, PrepareResources is unavailable and ListClaims
// shows the API's claims as they are.
func TestClaimsWithoutManager(t *testing.T) {
	e := start(t, 0)
	_, err := e.client.PrepareResources(context.Background(), podRequest("p1", "a"))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("PrepareResources without a manager: %v, want UNAVAILABLE", err)
	}
	if _, err := dratest.AllocatedClaim(context.Background(), e.api.Client, "default", "x", gpu, "dev-0"); err != nil {
		t.Fatal(err)
	}
	c := e.listClaims(t)["default/x"]
	if c.GetState() != dmv1.ClaimState_CLAIM_STATE_ALLOCATED || c.GetAllocatedNode() != dratest.Node || c.GetAllocatedHere() ||
		len(c.GetDevices()) != 1 || c.GetDevices()[0].GetDevice() != "dev-0" || c.GetDevices()[0].GetHealth() != "" {
		t.Errorf("claim x: %v, want allocated to %s (not by this node) with dev-0 and no health", c, dratest.Node)
	}
}

// On a cluster's API, ListClaims lists the claims that concern this node
// (here: allocated to it) unless all is set, with the namespace as asked;
// on the node-local API (TestClaimsWithoutManager) every claim.
func TestListClaimsOfThisNodeOrAll(t *testing.T) {
	e := startWith(t, 0, nil, claimview.SharedAPI(true))
	ctx := context.Background()
	if _, err := dratest.AllocatedClaim(ctx, e.api.Client, "default", "here", gpu, "dev-0"); err != nil {
		t.Fatal(err)
	}
	e.pendingClaim(t, "pending", "class")
	for _, tc := range []struct {
		req  *dmv1.ListClaimsRequest
		want []string
	}{
		{&dmv1.ListClaimsRequest{}, []string{"default/here"}},
		{&dmv1.ListClaimsRequest{All: true}, []string{"default/here", "default/pending"}},
		{&dmv1.ListClaimsRequest{All: true, Namespace: "default"}, []string{"default/here", "default/pending"}},
		{&dmv1.ListClaimsRequest{All: true, Namespace: "other"}, nil},
	} {
		resp, err := e.client.ListClaims(ctx, tc.req)
		if err != nil {
			t.Fatalf("ListClaims(%v): %v", tc.req, err)
		}
		var got []string
		for _, c := range resp.GetClaims() {
			got = append(got, c.GetNamespace()+"/"+c.GetName())
			if c.GetName() == "here" && (c.GetAllocatedNode() != dratest.Node || c.GetState() != dmv1.ClaimState_CLAIM_STATE_ALLOCATED) {
				t.Errorf("ListClaims(%v): claim here = %v, want allocated to %s", tc.req, c, dratest.Node)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("ListClaims(%v) = %v, want %v", tc.req, got, tc.want)
		}
	}
}
