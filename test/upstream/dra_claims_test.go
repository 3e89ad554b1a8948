package upstream

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// claimsDriver is a cmd/dradriver started with a state file and a control
// file: what the upstream app recorded (its gRPC calls, its prepared
// claims) is read back, and its failure modes are set, by SIGUSR1.
type claimsDriver struct {
	*driver
	state, control string
}

// driverState is cmd/dradriver's state file.
type driverState struct {
	Seq           int  `json:"seq"`
	FailPrepare   bool `json:"failPrepare"`
	FailUnprepare bool `json:"failUnprepare"`
	Calls         []struct {
		Method  string `json:"method"`
		Request struct {
			Claims []struct {
				Namespace string `json:"namespace"`
				UID       string `json:"uid"`
				Name      string `json:"name"`
			} `json:"claims"`
		} `json:"request"`
		Err  string `json:"error"`
		Done bool   `json:"done"`
	} `json:"calls"`
	Prepared []struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"prepared"`
}

// calls counts the driver's calls of method (NodePrepareResources,
// NodeUnprepareResources) naming the claim uid.
func (s driverState) calls(method, uid string) int {
	n := 0
	for _, c := range s.Calls {
		if !strings.HasSuffix(c.Method, "/"+method) {
			continue
		}
		for _, cl := range c.Request.Claims {
			if cl.UID == uid {
				n++
			}
		}
	}
	return n
}

// prepared reports whether the driver holds the claim uid prepared.
func (s driverState) prepared(uid string) bool {
	return slices.ContainsFunc(s.Prepared, func(p struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	}) bool {
		return p.UID == uid
	})
}

// startClaimsDriver starts a driver named name publishing devs, with a state
// and a control file, and the further flags extra.
func (n *draNode) startClaimsDriver(name string, devs []resourcev1.Device, extra ...string) *claimsDriver {
	n.t.Helper()
	state := filepath.Join(n.root, name+"-state.json")
	control := filepath.Join(n.root, name+"-control")
	d := n.startDriver(name, devs, append([]string{"--state-file", state, "--control-file", control}, extra...)...)
	return &claimsDriver{driver: d, state: state, control: control}
}

// readState has the driver write its state file (SIGUSR1) and returns it
// once it is newer than before the signal. Every call the driver served
// before the signal is in it.
func (d *claimsDriver) readState() driverState {
	d.n.t.Helper()
	return d.readStateT(d.n.t)
}

// readStateT is readState failing t, a subtest of the node's test.
func (d *claimsDriver) readStateT(t *testing.T) driverState {
	t.Helper()
	read := func() (driverState, error) {
		var s driverState
		data, err := os.ReadFile(d.state)
		if errors.Is(err, os.ErrNotExist) {
			return s, nil
		}
		if err != nil {
			return s, err
		}
		return s, json.Unmarshal(data, &s)
	}
	before, err := read()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.proc.Cmd.Process.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	var got driverState
	testutil.Eventually(t, "the driver's state file written", func() error {
		s, err := read()
		if err != nil {
			return err
		}
		if s.Seq <= before.Seq {
			return fmt.Errorf("seq %d, not after %d", s.Seq, before.Seq)
		}
		got = s
		return nil
	})
	return got
}

// setFailPrepare turns the upstream app's NodePrepareResources failure mode
// on or off.
func (d *claimsDriver) setFailPrepare(on bool) {
	t := d.n.t
	t.Helper()
	content := ""
	if on {
		content = "fail-prepare\n"
	}
	if err := os.WriteFile(d.control, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if s := d.readState(); s.FailPrepare != on {
		t.Fatalf("the driver's prepare failure mode is %v, want %v", s.FailPrepare, on)
	}
}

// operator is a clientset with the operator's kubeconfig, which may create
// DeviceClasses and ResourceClaims.
func (n *draNode) operator() kubernetes.Interface {
	n.t.Helper()
	return n.client(filepath.Join(n.root, "nodeplug", "kubeconfig-operator"))
}

// createClassAndClaim creates a DeviceClass selecting the driver's devices
// and a ResourceClaim "claim" in namespace ns with one request "gpu" of
// exactly one device of that class, configured with config if any.
func (n *draNode) createClassAndClaim(cs kubernetes.Interface, driverName, ns, claim string, config ...resourcev1.DeviceClaimConfiguration) *resourcev1.ResourceClaim {
	n.t.Helper()
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu." + driverName},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", driverName)},
		}}},
	}
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctxT(n.t), class, metav1.CreateOptions{}); err != nil {
		n.t.Fatalf("create DeviceClass %s: %v", class.Name, err)
	}
	return n.createClaim(cs, class.Name, ns, claim, config...)
}

// createClaim creates claim in ns: one request "gpu" for one device of
// class, configured with config if any.
func (n *draNode) createClaim(cs kubernetes.Interface, class, ns, claim string, config ...resourcev1.DeviceClaimConfiguration) *resourcev1.ResourceClaim {
	n.t.Helper()
	rc := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ns},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class}}},
			Config:   config,
		}},
	}
	got, err := cs.ResourceV1().ResourceClaims(ns).Create(ctxT(n.t), rc, metav1.CreateOptions{})
	if err != nil {
		n.t.Fatalf("create ResourceClaim %s/%s: %v", ns, claim, err)
	}
	return got
}

// podPrepare is a PrepareResources request for pod uid/name in ns whose
// container "main" uses the claim as pod claim "gpus" and whose container
// "sidecar" uses no claim.
func podPrepare(uid, ns, name, claim string) *dmv1.PrepareResourcesRequest {
	return &dmv1.PrepareResourcesRequest{
		PodUid: uid, PodNamespace: ns, PodName: name,
		PodClaims: []*dmv1.PodClaim{{Name: "gpus", ResourceClaimName: claim}},
		Containers: []*dmv1.ContainerClaims{
			{Name: "main", Claims: []*dmv1.ContainerClaim{{Name: "gpus"}}},
			{Name: "sidecar"},
		},
	}
}

// container is the named container of a PrepareResources answer.
func container(t *testing.T, resp *dmv1.PrepareResourcesResponse, name string) *dmv1.ContainerResources {
	t.Helper()
	for _, c := range resp.GetContainers() {
		if c.GetName() == name {
			return c
		}
	}
	t.Fatalf("no container %s in %v", name, resp.GetContainers())
	return nil
}

// cdiID is the CDI device ID the upstream test driver names for a claim's
// request.
func cdiID(driverName, claimUID, request string) string {
	return driverName + "/test=claim-" + claimUID + "-" + request
}

// checkPrepared checks an answer for podPrepare: "main" gets the claim's
// one device with the driver's CDI ID, "sidecar" nothing.
func checkPrepared(t *testing.T, resp *dmv1.PrepareResourcesResponse, d *claimsDriver, claim *resourcev1.ResourceClaim, devs []string) *dmv1.PreparedDevice {
	t.Helper()
	want := cdiID(d.name, string(claim.UID), "gpu")
	main := container(t, resp, "main")
	if !slices.Equal(main.GetCdiDeviceIds(), []string{want}) {
		t.Fatalf("container main's CDI IDs %v, want [%s]", main.GetCdiDeviceIds(), want)
	}
	if len(main.GetDevices()) != 1 {
		t.Fatalf("container main's devices %v, want one", main.GetDevices())
	}
	dev := main.GetDevices()[0]
	if dev.GetClaimName() != claim.Name || dev.GetClaimNamespace() != claim.Namespace || dev.GetClaimUid() != string(claim.UID) ||
		dev.GetDriver() != d.name || dev.GetPool() != d.n.node || !slices.Contains(devs, dev.GetDevice()) ||
		!slices.Equal(dev.GetRequests(), []string{"gpu"}) || !slices.Equal(dev.GetCdiDeviceIds(), []string{want}) {
		t.Fatalf("container main's device %v, want claim %s/%s (%s), driver %s, pool %s, one of %v, request gpu, CDI ID %s",
			dev, claim.Namespace, claim.Name, claim.UID, d.name, d.n.node, devs, want)
	}
	if side := container(t, resp, "sidecar"); len(side.GetCdiDeviceIds()) != 0 || len(side.GetDevices()) != 0 {
		t.Fatalf("container sidecar got %v, want nothing", side)
	}
	return dev
}

// dmClient is a DeviceManagerService client on the devicemanager's socket.
func (n *draNode) dmClient() dmv1.DeviceManagerServiceClient {
	n.t.Helper()
	conn, err := rpcutil.DialPeer(n.svc.Addr("devicemanager"))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { _ = conn.Close() })
	return dmv1.NewDeviceManagerServiceClient(conn)
}

// release releases the whole pod and checks it was dropped from claims
// claims.
func (n *draNode) release(podUID string, claims int64) {
	n.t.Helper()
	resp, err := n.dmClient().Release(ctxT(n.t), &dmv1.ReleaseRequest{PodUid: podUID})
	if err != nil {
		n.t.Fatalf("Release %s: %v", podUID, err)
	}
	if resp.GetReleasedClaims() != claims {
		n.t.Fatalf("Release %s: released_claims %d, want %d", podUID, resp.GetReleasedClaims(), claims)
	}
}

// listedClaim is the claim uid as ListClaims shows it (nil when absent).
func (n *draNode) listedClaim(uid string) (*dmv1.Claim, error) {
	resp, err := n.draClient().ListClaims(ctxT(n.t), &dmv1.ListClaimsRequest{})
	if err != nil {
		return nil, err
	}
	for _, c := range resp.GetClaims() {
		if c.GetUid() == uid {
			return c, nil
		}
	}
	return nil, nil
}

// waitUnprepared waits until the driver no longer holds the claim prepared
// and nodeplug no longer records it, and checks the driver was asked to
// unprepare it exactly once.
func (n *draNode) waitUnprepared(d *claimsDriver, uid string) {
	n.t.Helper()
	n.waitUnpreparedN(d, uid, 1)
}

// waitUnpreparedN is waitUnprepared for a claim the driver is asked to
// unprepare want times in all.
func (n *draNode) waitUnpreparedN(d *claimsDriver, uid string, want int) {
	n.t.Helper()
	testutil.Eventually(n.t, "claim "+uid+" unprepared", func() error {
		s := d.readState()
		if s.prepared(uid) {
			return errors.New("the driver still holds it prepared")
		}
		c, err := n.listedClaim(uid)
		if err != nil {
			return err
		}
		if c != nil && (c.GetState() == dmv1.ClaimState_CLAIM_STATE_PREPARED || c.GetState() == dmv1.ClaimState_CLAIM_STATE_UNPREPARING) {
			return fmt.Errorf("ListClaims shows it %v", c.GetState())
		}
		return nil
	})
	if got := d.readState().calls("NodeUnprepareResources", uid); got != want {
		n.t.Fatalf("the driver was asked %d times to unprepare claim %s, want %d", got, uid, want)
	}
}

// waitReleasedInAPI waits until the claim has no pod in reservedFor and no
// allocation (nodeplug allocated it, and no pod reserves it).
func (n *draNode) waitReleasedInAPI(cs kubernetes.Interface, claim *resourcev1.ResourceClaim) {
	n.t.Helper()
	testutil.Eventually(n.t, "claim "+claim.Name+" unreserved and deallocated", func() error {
		got, err := cs.ResourceV1().ResourceClaims(claim.Namespace).Get(ctxT(n.t), claim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(got.Status.ReservedFor) != 0 || got.Status.Allocation != nil {
			return fmt.Errorf("reservedFor %v, allocation %v", got.Status.ReservedFor, got.Status.Allocation)
		}
		return nil
	})
}

// checkAllocated checks the claim in the API is allocated to this node,
// reserved for exactly the pods, and that its one result is dev.
func (n *draNode) checkAllocated(cs kubernetes.Interface, claim *resourcev1.ResourceClaim, dev *dmv1.PreparedDevice, pods ...string) {
	n.t.Helper()
	got, err := cs.ResourceV1().ResourceClaims(claim.Namespace).Get(ctxT(n.t), claim.Name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	alloc := got.Status.Allocation
	if alloc == nil {
		n.t.Fatalf("claim %s has no status.allocation", claim.Name)
	}
	onNode := false
	if ns := alloc.NodeSelector; ns != nil {
		for _, term := range ns.NodeSelectorTerms {
			for _, f := range append(term.MatchFields, term.MatchExpressions...) {
				if slices.Contains(f.Values, n.node) {
					onNode = true
				}
			}
		}
	}
	if !onNode {
		n.t.Fatalf("claim %s's allocation node selector %v does not name node %s", claim.Name, alloc.NodeSelector, n.node)
	}
	res := alloc.Devices.Results
	if len(res) != 1 || res[0].Driver != dev.GetDriver() || res[0].Pool != dev.GetPool() || res[0].Device != dev.GetDevice() || res[0].Request != "gpu" {
		n.t.Fatalf("claim %s's allocation results %+v, want %s/%s/%s for request gpu", claim.Name, res, dev.GetDriver(), dev.GetPool(), dev.GetDevice())
	}
	var reserved []string
	for _, r := range got.Status.ReservedFor {
		if r.Resource != "pods" {
			n.t.Fatalf("claim %s reserved for %+v, not a pod", claim.Name, r)
		}
		reserved = append(reserved, string(r.UID))
	}
	slices.Sort(reserved)
	slices.Sort(pods)
	if !slices.Equal(reserved, pods) {
		n.t.Fatalf("claim %s reserved for %v, want %v", claim.Name, reserved, pods)
	}
}

// claimsNode starts a node with a claims driver publishing two devices and
// waits until its slice is in the API.
func claimsNode(t *testing.T, driverName string) (*draNode, *claimsDriver, kubernetes.Interface, []string) {
	t.Helper()
	n := startDRANode(t, longDelay)
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi"), gpu("gpu-1", "a100", 1, "40Gi")}
	d := n.startClaimsDriver(driverName, devs)
	cs := n.operator()
	n.waitSlices(cs, driverName, devs)
	n.waitDriver(driverName, oneServing(1, ""))
	return n, d, cs, deviceNames(devs)
}

// TestDRAClaimPrepareRelease: a claim nobody allocated is allocated on this
// node and prepared by the driver, whose helper GETs it from the API (the
// prepare succeeding is that GET finding it allocated with this UID); the
// container using it gets the driver's CDI ID; the same call again is the
// saved answer and calls no driver; pod resources Get shows the dynamic
// resource; Release unprepares it once and deallocates it.
func TestDRAClaimPrepareRelease(t *testing.T) {
	const driverName = "claims.test.nodeplug.io"
	n, d, cs, devs := claimsNode(t, driverName)
	claim := n.createClassAndClaim(cs, driverName, "default", "train")
	client := n.draClient()

	req := podPrepare("pod-uid-1", "default", "trainer", claim.Name)
	resp, err := client.PrepareResources(ctxT(t), req)
	if err != nil {
		t.Fatalf("PrepareResources: %v", err)
	}
	dev := checkPrepared(t, resp, d, claim, devs)
	n.checkAllocated(cs, claim, dev, "pod-uid-1")
	s := d.readState()
	if got := s.calls("NodePrepareResources", string(claim.UID)); got != 1 || !s.prepared(string(claim.UID)) {
		t.Fatalf("the driver was asked %d times to prepare the claim (prepared: %v), want once", got, s.Prepared)
	}

	again, err := client.PrepareResources(ctxT(t), req)
	if err != nil {
		t.Fatalf("PrepareResources again: %v", err)
	}
	checkPrepared(t, again, d, claim, devs)
	if got := d.readState().calls("NodePrepareResources", string(claim.UID)); got != 1 {
		t.Fatalf("after the same PrepareResources again the driver was asked %d times to prepare the claim, want once", got)
	}

	listed, err := n.listedClaim(string(claim.UID))
	if err != nil || listed == nil {
		t.Fatalf("ListClaims: %v, claim %s listed: %v", err, claim.UID, listed)
	}
	if listed.GetState() != dmv1.ClaimState_CLAIM_STATE_PREPARED || !listed.GetAllocatedHere() || listed.GetAllocatedNode() != n.node ||
		!slices.Equal(listed.GetCdiDeviceIds(), []string{cdiID(driverName, string(claim.UID), "gpu")}) ||
		len(listed.GetPods()) != 1 || listed.GetPods()[0].GetUid() != "pod-uid-1" {
		t.Fatalf("ListClaims shows %v, want prepared, allocated here on %s, for pod-uid-1, with the driver's CDI ID", listed, n.node)
	}

	checkPodResourcesDRA(t, n, "default", "trainer", claim, dev)

	n.release("pod-uid-1", 1)
	n.waitUnprepared(d, string(claim.UID))
	n.waitReleasedInAPI(cs, claim)
}

// checkPodResourcesDRA checks that pod resources Get shows, for the pod's
// container main, the claim's device with its CDI ID as a dynamic resource.
func checkPodResourcesDRA(t *testing.T, n *draNode, ns, pod string, claim *resourcev1.ResourceClaim, dev *dmv1.PreparedDevice) {
	t.Helper()
	sock := filepath.Join(n.root, "pod-resources", "kubelet.sock")
	prc, conn, err := podresources.GetV1Client(ctxT(t), "unix://"+sock, 0, podResourcesMaxMsgSize)
	if err != nil {
		t.Fatalf("GetV1Client %s: %v", sock, err)
	}
	defer func() { _ = conn.Close() }()
	got, err := prc.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodName: pod, PodNamespace: ns})
	if err != nil {
		t.Fatalf("pod resources Get %s/%s: %v", ns, pod, err)
	}
	want := &podresourcesv1.DynamicResource{
		ClaimName: claim.Name, ClaimNamespace: claim.Namespace,
		ClaimResources: []*podresourcesv1.ClaimResource{{
			DriverName: dev.GetDriver(), PoolName: dev.GetPool(), DeviceName: dev.GetDevice(),
			CdiDevices: []*podresourcesv1.CDIDevice{{Name: dev.GetCdiDeviceIds()[0]}},
		}},
	}
	var mainC *podresourcesv1.ContainerResources
	for _, c := range got.GetPodResources().GetContainers() {
		if c.GetName() == "main" {
			mainC = c
		} else if len(c.GetDynamicResources()) != 0 {
			t.Fatalf("pod resources: container %s has dynamic resources %v, want none", c.GetName(), c.GetDynamicResources())
		}
	}
	if mainC == nil || len(mainC.GetDynamicResources()) != 1 {
		t.Fatalf("pod resources Get: %v, want container main with one dynamic resource", got)
	}
	if diff := protoDiff(want, mainC.GetDynamicResources()[0]); diff != "" {
		t.Fatalf("pod resources dynamic resource: %s", diff)
	}
}

// TestDRAClaimDriverError: the driver failing NodePrepareResources fails
// the prepare with its message, leaves nothing prepared, in the driver and
// in ListClaims; the same call once the driver works again prepares it.
func TestDRAClaimDriverError(t *testing.T) {
	const driverName = "failing.test.nodeplug.io"
	n, d, cs, devs := claimsNode(t, driverName)
	claim := n.createClassAndClaim(cs, driverName, "default", "flaky")
	client := n.draClient()
	req := podPrepare("pod-uid-f", "default", "flaky", claim.Name)

	d.setFailPrepare(true)
	_, err := client.PrepareResources(ctxT(t), req)
	if err == nil {
		t.Fatal("PrepareResources succeeded with the driver failing")
	}
	if !strings.Contains(err.Error(), "simulated PrepareResources failure") {
		t.Fatalf("PrepareResources: %v, want the driver's message", err)
	}
	s := d.readState()
	if len(s.Prepared) != 0 {
		t.Fatalf("the failing driver holds %v prepared", s.Prepared)
	}
	if c, err := n.listedClaim(string(claim.UID)); err != nil || c == nil || c.GetState() == dmv1.ClaimState_CLAIM_STATE_PREPARED {
		t.Fatalf("ListClaims after the failed prepare: %v, %v; want it listed, not prepared", c, err)
	}
	// The driver may hold a claim whose prepare failed (an answer lost),
	// so it is unprepared before its reservation goes: once, here.
	if got := s.calls("NodeUnprepareResources", string(claim.UID)); got != 1 {
		t.Fatalf("after the failed prepare the driver was asked %d times to unprepare the claim, want once", got)
	}

	d.setFailPrepare(false)
	resp, err := client.PrepareResources(ctxT(t), req)
	if err != nil {
		t.Fatalf("PrepareResources once the driver works: %v", err)
	}
	dev := checkPrepared(t, resp, d, claim, devs)
	n.checkAllocated(cs, claim, dev, "pod-uid-f")
	if s := d.readState(); !s.prepared(string(claim.UID)) {
		t.Fatalf("the driver holds %v prepared, not the claim", s.Prepared)
	}
	n.release("pod-uid-f", 1)
	n.waitUnpreparedN(d, string(claim.UID), 2) // the one after the failure, and the release's
}

// TestDRAClaimShared: a claim two pods use is prepared once, stays prepared
// when the first pod is released, and is unprepared once after the second.
func TestDRAClaimShared(t *testing.T) {
	const driverName = "shared.test.nodeplug.io"
	n, d, cs, devs := claimsNode(t, driverName)
	claim := n.createClassAndClaim(cs, driverName, "default", "shared")
	client := n.draClient()

	r1, err := client.PrepareResources(ctxT(t), podPrepare("pod-a", "default", "a", claim.Name))
	if err != nil {
		t.Fatalf("PrepareResources pod a: %v", err)
	}
	dev := checkPrepared(t, r1, d, claim, devs)
	r2, err := client.PrepareResources(ctxT(t), podPrepare("pod-b", "default", "b", claim.Name))
	if err != nil {
		t.Fatalf("PrepareResources pod b: %v", err)
	}
	if dev2 := checkPrepared(t, r2, d, claim, devs); dev2.GetDevice() != dev.GetDevice() {
		t.Fatalf("pod b got device %s, pod a %s: one claim, one device", dev2.GetDevice(), dev.GetDevice())
	}
	n.checkAllocated(cs, claim, dev, "pod-a", "pod-b")
	if got := d.readState().calls("NodePrepareResources", string(claim.UID)); got != 1 {
		t.Fatalf("the shared claim was prepared %d times, want once", got)
	}

	n.release("pod-a", 1)
	// The claim stays prepared for pod b: ListClaims shows it prepared for
	// pod b alone, and the driver was not asked to unprepare it.
	testutil.Eventually(t, "claim reserved for pod b alone", func() error {
		got, err := cs.ResourceV1().ResourceClaims(claim.Namespace).Get(ctxT(t), claim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(got.Status.ReservedFor) != 1 || got.Status.ReservedFor[0].UID != "pod-b" {
			return fmt.Errorf("reservedFor %v", got.Status.ReservedFor)
		}
		return nil
	})
	c, err := n.listedClaim(string(claim.UID))
	if err != nil || c == nil || c.GetState() != dmv1.ClaimState_CLAIM_STATE_PREPARED || len(c.GetPods()) != 1 || c.GetPods()[0].GetUid() != "pod-b" {
		t.Fatalf("ListClaims after pod a's release: %v, %v; want prepared for pod-b", c, err)
	}
	if s := d.readState(); s.calls("NodeUnprepareResources", string(claim.UID)) != 0 || !s.prepared(string(claim.UID)) {
		t.Fatalf("after the first pod's release the driver was asked to unprepare the claim %d times (prepared %v), want none",
			s.calls("NodeUnprepareResources", string(claim.UID)), s.Prepared)
	}

	n.release("pod-b", 1)
	n.waitUnprepared(d, string(claim.UID))
	n.waitReleasedInAPI(cs, claim)
}

// TestDRAClaimKillBetweenPrepareAndRelease: the dramanager killed with
// SIGKILL after a prepare, and restarted, still has the claim prepared
// (the same prepare again calls no driver), and a release then unprepares
// it exactly once.
func TestDRAClaimKillBetweenPrepareAndRelease(t *testing.T) {
	const driverName = "durable.test.nodeplug.io"
	n, d, cs, devs := claimsNode(t, driverName)
	claim := n.createClassAndClaim(cs, driverName, "default", "durable")
	req := podPrepare("pod-k", "default", "k", claim.Name)

	resp, err := n.draClient().PrepareResources(ctxT(t), req)
	if err != nil {
		t.Fatalf("PrepareResources: %v", err)
	}
	dev := checkPrepared(t, resp, d, claim, devs)

	n.killDRA()
	n.startDRA()
	n.waitDriver(driverName, oneServing(1, ""))

	again, err := n.draClient().PrepareResources(ctxT(t), req)
	if err != nil {
		t.Fatalf("PrepareResources after the restart: %v", err)
	}
	if dev2 := checkPrepared(t, again, d, claim, devs); dev2.GetDevice() != dev.GetDevice() {
		t.Fatalf("after the restart the pod got device %s, before %s", dev2.GetDevice(), dev.GetDevice())
	}
	if got := d.readState().calls("NodePrepareResources", string(claim.UID)); got != 1 {
		t.Fatalf("the claim was prepared %d times across the restart, want once", got)
	}
	n.checkAllocated(cs, claim, dev, "pod-k")

	n.release("pod-k", 1)
	n.waitUnprepared(d, string(claim.UID))
	n.waitReleasedInAPI(cs, claim)
}

// TestDRAClaimsNodeplugctl is docs/dra-drivers.md's walk-through for a driver
// author, with nodeplugctl alone: apply a DeviceClass and a claim from
// YAML, prepare them for a pod, see the claim prepared with the driver's
// CDI ID in `claims`, release the pod. It logs what nodeplugctl printed.
func TestDRAClaimsNodeplugctl(t *testing.T) {
	const driverName = "gpu.example.com"
	n, d, cs, _ := claimsNode(t, driverName)
	yaml := filepath.Join(n.root, "claim.yaml")
	if err := os.WriteFile(yaml, []byte(`apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.example.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].model == "a100"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: train
  namespace: default
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.example.com
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Logf("$ nodeplugctl apply -f claim.yaml\n%s", n.ctl("apply", "-f", yaml))
	claim, err := cs.ResourceV1().ResourceClaims("default").Get(ctxT(t), "train", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the applied claim: %v", err)
	}
	t.Logf("$ nodeplugctl claims\n%s", n.ctl("claims"))

	prepArgs := []string{"prepare", "--pod-uid", "pod-uid-1", "--namespace", "default", "--name", "trainer",
		"--claim", "gpus=train", "--container", "main=gpus/gpu"}
	t.Logf("$ nodeplugctl %s\n%s", strings.Join(prepArgs, " "), n.ctl(prepArgs...))
	var resp dmv1.PrepareResourcesResponse
	if err := protojson.Unmarshal(n.ctl(append(prepArgs, "-o", "json")...), &resp); err != nil {
		t.Fatalf("nodeplugctl prepare -o json: %v", err)
	}
	want := cdiID(driverName, string(claim.UID), "gpu")
	if main := container(t, &resp, "main"); !slices.Equal(main.GetCdiDeviceIds(), []string{want}) {
		t.Fatalf("nodeplugctl prepare: container main's CDI IDs %v, want [%s]", main.GetCdiDeviceIds(), want)
	}
	if got := d.readState().calls("NodePrepareResources", string(claim.UID)); got != 1 {
		t.Fatalf("two nodeplugctl prepare of the same pod asked the driver %d times, want once", got)
	}

	table := string(n.ctl("claims"))
	t.Logf("$ nodeplugctl claims\n%s", table)
	var list dmv1.ListClaimsResponse
	if err := protojson.Unmarshal(n.ctl("claims", "-o", "json"), &list); err != nil {
		t.Fatalf("nodeplugctl claims -o json: %v", err)
	}
	if len(list.GetClaims()) != 1 || list.GetClaims()[0].GetState() != dmv1.ClaimState_CLAIM_STATE_PREPARED ||
		!slices.Equal(list.GetClaims()[0].GetCdiDeviceIds(), []string{want}) {
		t.Fatalf("nodeplugctl claims -o json: %v, want train prepared with %s", list.GetClaims(), want)
	}
	if !strings.Contains(table, "train") || !strings.Contains(table, want) {
		t.Fatalf("nodeplugctl claims shows no train with %s:\n%s", want, table)
	}

	t.Logf("$ nodeplugctl release --pod pod-uid-1\n%s", n.ctl("release", "--pod", "pod-uid-1"))
	n.waitUnprepared(d, string(claim.UID))
	n.waitReleasedInAPI(cs, claim)
	t.Logf("$ nodeplugctl claims\n%s", n.ctl("claims"))
}

// TestDRAPodFromManifest: a driver's manifest, as its users write it — a
// Namespace, a DeviceClass, a ResourceClaimTemplate and a Pod whose
// containers use the template's claim — applied with nodeplugctl to the
// node-local API: nodeplug makes the pod's claim from the template, has it
// allocated and prepared by the (unmodified, kubeletplugin-based) driver,
// binds the pod and records it in the pod's status and events;
// `nodeplugctl delete pod` unprepares the claim and deletes it.
func TestDRAPodFromManifest(t *testing.T) {
	const driverName = "gpu.example.com"
	n, d, cs, _ := claimsNode(t, driverName)
	manifest := filepath.Join(n.root, "pod.yaml")
	if err := os.WriteFile(manifest, []byte(`apiVersion: v1
kind: Pod
metadata:
  name: trainer
  namespace: ml
spec:
  containers:
  - name: main
    image: registry.example.com/trainer:1.0
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: one-gpu
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: one-gpu
  namespace: ml
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.example.com
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.example.com
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.example.com"
---
apiVersion: v1
kind: Namespace
metadata:
  name: ml
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := string(n.ctl("apply", "-f", manifest))
	t.Logf("$ nodeplugctl apply -f pod.yaml\n%s", out)
	for _, line := range []string{"namespace/ml created", "deviceclass.resource.k8s.io/gpu.example.com created",
		"resourceclaimtemplate.resource.k8s.io/one-gpu created", "pod/trainer created"} {
		if !strings.Contains(out, line+"\n") {
			t.Fatalf("nodeplugctl apply printed no %q", line)
		}
	}
	var claim *resourcev1.ResourceClaim
	testutil.Eventually(t, "pod trainer bound with its claim prepared", func() error {
		pod, err := cs.CoreV1().Pods("ml").Get(ctxT(t), "trainer", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.Spec.NodeName == "" || len(pod.Status.ResourceClaimStatuses) != 1 {
			return fmt.Errorf("node %q, claim statuses %v, conditions %v", pod.Spec.NodeName, pod.Status.ResourceClaimStatuses, pod.Status.Conditions)
		}
		claim, err = cs.ResourceV1().ResourceClaims("ml").Get(ctxT(t), *pod.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !d.readState().prepared(string(claim.UID)) {
			return fmt.Errorf("the driver has not prepared claim %s", claim.Name)
		}
		if len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].UID != pod.UID {
			return fmt.Errorf("claim reserved for %v", claim.Status.ReservedFor)
		}
		return nil
	})
	// Events are recorded in the background, after the status.
	testutil.Eventually(t, "the pod's events recorded", func() error {
		events, err := cs.CoreV1().Events("ml").List(ctxT(t), metav1.ListOptions{FieldSelector: "involvedObject.name=trainer"})
		if err != nil {
			return err
		}
		reasons := map[string]bool{}
		for _, e := range events.Items {
			reasons[e.Reason] = true
		}
		if !reasons["Scheduled"] || !reasons["PreparedDynamicResources"] {
			return fmt.Errorf("the pod's events are %v, want Scheduled and PreparedDynamicResources", reasons)
		}
		return nil
	})
	// What a runtime would be given for the pod's container: the claim's
	// CDI device, through the devicemanager's StartContainer.
	pod, err := cs.CoreV1().Pods("ml").Get(ctxT(t), "trainer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	start, err := n.startContainer(string(pod.UID), "main")
	if want := cdiID(driverName, string(claim.UID), "gpu"); err != nil || !slices.Contains(start.GetCdiDevices(), want) {
		t.Fatalf("StartContainer of the pod's container: %v %v, want the claim's CDI device %s", start.GetCdiDevices(), err, want)
	}
	t.Logf("$ nodeplugctl delete pod ml/trainer\n%s", n.ctl("delete", "pod", "ml/trainer"))
	n.waitUnprepared(d, string(claim.UID))
	testutil.Eventually(t, "the claim made for the pod deleted", func() error {
		if _, err := cs.ResourceV1().ResourceClaims("ml").Get(ctxT(t), claim.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: %v", claim.Name, err)
		}
		return nil
	})
}
