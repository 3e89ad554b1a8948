package upstream

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// clusterDriver is the DRA driver every node of the cluster tests runs (one
// instance each, publishing the node's pool).
const clusterDriver = "gpu.example.com"

// startClusterNode starts nodeplug's services over a new root dir for the
// Node name, its dramanager pointed at the control plane with an identity
// in the group deploy/rbac binds (not an admin), and its drivers given the
// driver identity deploy/rbac's example binds. The Node object is created
// as a kubelet would register it.
func startClusterNode(t *testing.T, cp *controlPlane, name string, delay time.Duration) *draNode {
	t.Helper()
	return startClusterNodeAs(t, cp, name, delay, "nodeplug:"+name, []string{nodeplugGroup})
}

// startClusterNodeAs is startClusterNode with the dramanager's identity
// (user, groups) given.
func startClusterNodeAs(t *testing.T, cp *controlPlane, name string, delay time.Duration, user string, groups []string) *draNode {
	t.Helper()
	if _, err := cp.admin.CoreV1().Nodes().Get(ctxT(t), name, metav1.GetOptions{}); err != nil {
		cp.createNode(name)
	}
	root := testutil.TempDir(t)
	n := &draNode{t: t, root: root, node: name}
	n.driverConfig = cp.kubeconfig(root, driverIdentity, nil)
	n.svc = stack.NewProcesses(binDir, root)
	n.api = stack.NewProcesses(binDir, root) // not started: the cluster's API server serves
	n.dmp = stack.NewProcesses(binDir, root)
	n.dmp.Args = []string{
		"--node-name", name,
		"--kubeconfig", cp.kubeconfig(root, user, groups),
		"--dra-disconnect-delay", delay.String(),
	}
	t.Cleanup(n.stop)
	ctx := ctxT(t)
	for _, s := range []string{"watcher", "devicemanager"} {
		if err := n.svc.Start(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	n.startDRA()
	if err := n.svc.Start(ctx, "reconciler"); err != nil {
		t.Fatal(err)
	}
	return n
}

// twoGPUs are the devices each node's driver publishes.
func twoGPUs() []resourcev1.Device {
	return []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi"), gpu("gpu-1", "a100", 1, "40Gi")}
}

// createClass creates the DeviceClass of the cluster tests' driver once.
func createClass(t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	name := "gpu." + clusterDriver
	class := &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{
			CEL: &resourcev1.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", clusterDriver)},
		}}},
	}
	if _, err := cs.ResourceV1().DeviceClasses().Create(ctxT(t), class, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("create DeviceClass %s: %v", name, err)
	}
	return name
}

// nodeSelector is the node selector a scheduler writes into an allocation
// for one node.
func nodeSelector(node string) *corev1.NodeSelector {
	return &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}
}

// allocateAsScheduler writes the claim's status as the scheduler does for a
// pod on node: device of node's pool for request gpu, the node selector,
// and the pod in reservedFor.
func allocateAsScheduler(t *testing.T, cs kubernetes.Interface, claim *resourcev1.ResourceClaim, node, device, podUID, podName string) *resourcev1.ResourceClaim {
	t.Helper()
	c := claim.DeepCopy()
	now := metav1.Now()
	c.Status.Allocation = &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: clusterDriver, Pool: node, Device: device,
		}}},
		NodeSelector:        nodeSelector(node),
		AllocationTimestamp: &now,
	}
	c.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: podName, UID: types.UID(podUID)}}
	out, err := cs.ResourceV1().ResourceClaims(c.Namespace).UpdateStatus(ctxT(t), c, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("write claim %s's allocation as the scheduler: %v", c.Name, err)
	}
	return out
}

// wantCode checks err is a gRPC status of code whose message holds each of
// parts.
func wantCode(t *testing.T, what string, err error, code codes.Code, parts ...string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: %v (code %v), want %v", what, err, status.Code(err), code)
	}
	for _, p := range parts {
		if !strings.Contains(err.Error(), p) {
			t.Fatalf("%s: %q does not say %q", what, err, p)
		}
	}
}

// TestCluster runs nodeplug beside a real kube-apiserver (and etcd), with
// exactly the permissions deploy/rbac gives its identity and the driver's:
// slices, claims prepared and released, claims a scheduler allocated, the
// API server restarted, a watch too old to resume; then three nodes on the
// one API server.
func TestCluster(t *testing.T) {
	cp := startControlPlane(t)
	checkRelease(t, cp.admin)
	class := createClass(t, cp.admin)
	n := startClusterNode(t, cp, "node-a", shortDelay)
	d := n.startClaimsDriver(clusterDriver, twoGPUs())
	n.waitSlices(cp.admin, clusterDriver, twoGPUs())
	more := twoGPUs() // node-a's devices; a third comes with the API server's restart

	t.Run("claim prepared and released", func(t *testing.T) {
		defer n.in(t)()
		claim := n.createClaim(cp.admin, class, "default", "lifecycle")
		resp, err := n.draClient().PrepareResources(ctxT(t), podPrepare("pod-a-1", "default", "trainer", claim.Name))
		if err != nil {
			t.Fatalf("PrepareResources: %v", err)
		}
		dev := checkPrepared(t, resp, d, claim, []string{"gpu-0", "gpu-1"})
		n.checkAllocated(cp.admin, claim, dev, "pod-a-1")
		n.release("pod-a-1", 1)
		n.waitUnprepared(d, string(claim.UID))
		n.waitReleasedInAPI(cp.admin, claim)
	})

	t.Run("claim allocated by a scheduler used as it is", func(t *testing.T) {
		defer n.in(t)()
		claim := n.createClaim(cp.admin, class, "default", "scheduled")
		claim = allocateAsScheduler(t, cp.admin, claim, "node-a", "gpu-1", "pod-a-2", "scheduled")
		resp, err := n.draClient().PrepareResources(ctxT(t), podPrepare("pod-a-2", "default", "scheduled", claim.Name))
		if err != nil {
			t.Fatalf("PrepareResources: %v", err)
		}
		dev := checkPrepared(t, resp, d, claim, []string{"gpu-1"})
		n.checkAllocated(cp.admin, claim, dev, "pod-a-2")
		got, err := cp.admin.ResourceV1().ResourceClaims("default").Get(ctxT(t), claim.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := got.Annotations["nodeplug.io/allocated-by-node"]; ok || !got.Status.Allocation.AllocationTimestamp.Equal(claim.Status.Allocation.AllocationTimestamp) {
			t.Fatalf("the scheduler's allocation was changed: annotations %v, allocation %+v", got.Annotations, got.Status.Allocation)
		}
		n.release("pod-a-2", 1)
		n.waitUnprepared(d, string(claim.UID))
		// The allocation is the scheduler's: released by the pod, it stays
		// for the control plane to deallocate.
		testutil.Eventually(t, "pod-a-2 unreserved, the allocation kept", func() error {
			got, err := cp.admin.ResourceV1().ResourceClaims("default").Get(ctxT(t), claim.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(got.Status.ReservedFor) != 0 || got.Status.Allocation == nil {
				return fmt.Errorf("reservedFor %v, allocation %v", got.Status.ReservedFor, got.Status.Allocation)
			}
			return nil
		})
	})

	t.Run("claim allocated to another node refused", func(t *testing.T) {
		defer n.in(t)()
		claim := n.createClaim(cp.admin, class, "default", "elsewhere")
		allocateAsScheduler(t, cp.admin, claim, "node-z", "gpu-0", "pod-a-3", "elsewhere")
		_, err := n.draClient().PrepareResources(ctxT(t), podPrepare("pod-a-3", "default", "elsewhere", claim.Name))
		wantCode(t, "PrepareResources of a claim allocated to node-z", err, codes.FailedPrecondition, "node-z", "node-a")
		if s := d.readState(); s.calls("NodePrepareResources", string(claim.UID)) != 0 {
			t.Fatalf("the driver was asked to prepare a claim allocated to another node")
		}
	})

	t.Run("API server restarted mid-watch", func(t *testing.T) {
		defer n.in(t)()
		start := time.Now()
		cp.restartAPI(syscall.SIGTERM)
		t.Logf("API server restarted in %s", time.Since(start).Round(time.Millisecond))
		// The driver republishes after the restart; the dramanager's view
		// (its informers) follows the API again.
		more = append(twoGPUs(), gpu("gpu-2", "a100", 2, "40Gi"))
		d.publish(more)
		testutil.EventuallyWithin(t, afterRestart, "the driver's slice with gpu-2", func() error {
			l, err := n.slices(cp.admin, clusterDriver)
			if err != nil {
				return err
			}
			if len(l.Items) != 1 {
				return fmt.Errorf("%d slices", len(l.Items))
			}
			return sameDevices(l.Items[0].Spec.Devices, more)
		})
		t.Logf("the driver republished after %s", time.Since(start).Round(time.Millisecond))
		n.waitSameSlices(cp.admin)
		t.Logf("the dramanager's view was the API's again after %s", time.Since(start).Round(time.Millisecond))
		claim := n.createClaim(cp.admin, class, "default", "after-restart")
		resp, err := n.draClient().PrepareResources(ctxT(t), podPrepare("pod-a-4", "default", "after", claim.Name))
		if err != nil {
			t.Fatalf("PrepareResources after the API server's restart: %v", err)
		}
		checkPrepared(t, resp, d, claim, gpuNames)
		n.release("pod-a-4", 1)
		n.waitUnprepared(d, string(claim.UID))
		n.waitReleasedInAPI(cp.admin, claim)
	})

	t.Run("API server killed mid-prepare", func(t *testing.T) {
		defer n.in(t)()
		claim := n.createClaim(cp.admin, class, "default", "mid-prepare")
		req := podPrepare("pod-a-5", "default", "mid", claim.Name)
		// The API server stops answering, the prepare starts and waits on
		// it, the API server dies and comes back: the prepare ends either
		// way, and one asked again (as a kubelet asks again) prepares the
		// claim once, reserved once.
		if err := cp.api.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		first := make(chan error, 1)
		go func() {
			_, err := n.draClient().PrepareResources(ctxT(t), req)
			first <- err
		}()
		cp.restartAPI(syscall.SIGKILL)
		if err := <-first; err != nil {
			t.Logf("the prepare the API server's death cut: %v", err)
		}
		var resp *dmv1.PrepareResourcesResponse
		testutil.Eventually(t, "PrepareResources after the API server came back", func() error {
			var err error
			resp, err = n.draClient().PrepareResources(ctxT(t), req)
			return err
		})
		dev := checkPrepared(t, resp, d, claim, gpuNames)
		n.checkAllocated(cp.admin, claim, dev, "pod-a-5")
		if got := d.readState().calls("NodePrepareResources", string(claim.UID)); got != 1 {
			t.Fatalf("the driver was asked %d times to prepare the claim, want once", got)
		}
		n.release("pod-a-5", 1)
		n.waitUnprepared(d, string(claim.UID))
		n.waitReleasedInAPI(cp.admin, claim)
	})

	t.Run("watch too old to resume is listed again", func(t *testing.T) {
		defer n.in(t)()
		// The dramanager is frozen while the API server restarts and its
		// slice is deleted (the driver publishes a new one) and etcd is
		// compacted: its informers' watches, resumed from before all
		// that, get 410 Gone (the restarted API server's watch cache
		// starts after them, and etcd no longer has their revisions).
		// Only a new list gives the view that drops the deleted slice.
		before, err := n.slices(cp.admin, clusterDriver)
		if err != nil || len(before.Items) != 1 {
			t.Fatalf("slices before: %v, %v", before, err)
		}
		dm := n.draProcess().Cmd.Process
		if err := dm.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		cont := sync.OnceFunc(func() { _ = dm.Signal(syscall.SIGCONT) })
		t.Cleanup(cont)
		start := time.Now()
		cp.stopAPI(syscall.SIGTERM)
		cp.startAPI()
		cp.waitReady()
		t.Logf("API server restarted in %s", time.Since(start).Round(time.Millisecond))
		if err := cp.admin.ResourceV1().ResourceSlices().Delete(ctxT(t), before.Items[0].Name, metav1.DeleteOptions{}); err != nil {
			t.Fatalf("delete slice %s: %v", before.Items[0].Name, err)
		}
		testutil.EventuallyWithin(t, afterRestart, "the driver's new slice", func() error {
			l, err := n.slices(cp.admin, clusterDriver)
			if err != nil {
				return err
			}
			if len(l.Items) != 1 || l.Items[0].UID == before.Items[0].UID {
				return fmt.Errorf("slices %d", len(l.Items))
			}
			return nil
		})
		t.Logf("the driver published a new slice after %s", time.Since(start).Round(time.Millisecond))
		if err := cp.compactEtcd(ctxT(t)); err != nil {
			t.Fatalf("compact etcd: %v", err)
		}
		cont()
		n.waitSameSlices(cp.admin)
		t.Logf("the dramanager's view was the API's again after %s", time.Since(start).Round(time.Millisecond))
	})

	t.Run("permissions checked at start and refusals named", func(t *testing.T) {
		defer n.in(t)()
		testPermissions(t, cp, class, n)
	})

	t.Run("three nodes on one API server", func(t *testing.T) {
		defer n.in(t)()
		testThreeNodes(t, cp, class, n, d, more)
	})
}

// permissionsHealth is the dramanager's gRPC health service that says
// whether its identity holds every rule it needs.
const permissionsHealth = "nodeplug.dramanager.KubernetesAPIPermissions"

// testPermissions checks the start check and the refusals: node-a, with
// deploy/rbac's permissions, lacks none; a node whose identity has no role
// lacks every rule and is refused its first read; a node whose role lacks
// update on resourceclaims/binding says that one up front, and a prepare
// names it, with the verb and the identity.
func testPermissions(t *testing.T, cp *controlPlane, class string, a *draNode) {
	if missing := a.waitPermissionsChecked(); missing != 0 {
		t.Fatalf("node-a, with deploy/rbac's role, lacks %d permissions:\n%s", missing, a.draProcess().Logs())
	}
	a.waitPermissionsHealth(healthpb.HealthCheckResponse_SERVING, testutil.Deadline)

	nobody := startClusterNodeAs(t, cp, "node-p", shortDelay, "nodeplug:node-p", nil)
	if missing := nobody.waitPermissionsChecked(); missing == 0 {
		t.Fatal("a dramanager with no role lacks no permission, says its start check")
	}
	nobody.waitPermissionsHealth(healthpb.HealthCheckResponse_NOT_SERVING, testutil.Deadline)
	claim := nobody.createClaim(cp.admin, class, "default", "refused")
	_, err := nobody.draClient().PrepareResources(ctxT(t), podPrepare("pod-p-1", "default", "refused", claim.Name))
	wantCode(t, "PrepareResources with no role", err, codes.PermissionDenied, "get", "resourceclaims", `"nodeplug:node-p"`)

	// deploy/rbac's role but for update on resourceclaims/binding, which
	// status.allocation and status.reservedFor need since Kubernetes 1.36.
	role, err := cp.admin.RbacV1().ClusterRoles().Get(ctxT(t), "nodeplug-dramanager", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("deploy/rbac's ClusterRole: %v", err)
	}
	partial := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "nodeplug-dramanager-without-binding"}}
	for _, r := range role.Rules {
		r.Resources = slices.DeleteFunc(slices.Clone(r.Resources), func(res string) bool { return res == "resourceclaims/binding" })
		if len(r.Resources) > 0 {
			partial.Rules = append(partial.Rules, r)
		}
	}
	if _, err := cp.admin.RbacV1().ClusterRoles().Create(ctxT(t), partial, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.admin.RbacV1().ClusterRoleBindings().Create(ctxT(t), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: partial.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: partial.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "nodeplug:without-binding"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	q := startClusterNodeAs(t, cp, "node-q", shortDelay, "nodeplug:node-q", []string{"nodeplug:without-binding"})
	if missing := q.waitPermissionsChecked(); missing != 1 {
		t.Fatalf("without update on resourceclaims/binding the start check finds %d missing, want 1:\n%s", missing, q.draProcess().Logs())
	}
	lines := q.draProcess().LogLines("lacks a permission")
	if len(lines) != 1 || lines[0]["verb"] != "update" || lines[0]["resource"] != "resourceclaims/binding" {
		t.Fatalf("the missing permission logged as %v, want update on resourceclaims/binding", lines)
	}
	q.waitPermissionsHealth(healthpb.HealthCheckResponse_NOT_SERVING, testutil.Deadline)
	qd := q.startClaimsDriver(clusterDriver, twoGPUs())
	q.waitSlices(cp.admin, clusterDriver, twoGPUs())
	claim = q.createClaim(cp.admin, class, "default", "no-binding")
	_, err = q.draClient().PrepareResources(ctxT(t), podPrepare("pod-q-1", "default", "no-binding", claim.Name))
	wantCode(t, "PrepareResources without update on resourceclaims/binding", err, codes.PermissionDenied,
		"update", "resourceclaims/binding", "nodeplug:node-q")
	if s := qd.readState(); s.calls("NodePrepareResources", string(claim.UID)) != 0 {
		t.Fatal("the driver was asked to prepare a claim whose allocation was refused")
	}
	got, err := cp.admin.ResourceV1().ResourceClaims("default").Get(ctxT(t), claim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Allocation != nil || len(got.Status.ReservedFor) != 0 {
		t.Fatalf("a refused allocation left status %+v", got.Status)
	}

	// Granted later, the rule shows in the health without a restart (the
	// check is made again while one is missing), and the claim prepares.
	if _, err := cp.admin.RbacV1().ClusterRoleBindings().Create(ctxT(t), &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "nodeplug-dramanager-granted-later"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "nodeplug-dramanager"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: "nodeplug:without-binding"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	q.waitPermissionsHealth(healthpb.HealthCheckResponse_SERVING, 3*time.Minute)
	resp, err := q.draClient().PrepareResources(ctxT(t), podPrepare("pod-q-1", "default", "no-binding", claim.Name))
	if err != nil {
		t.Fatalf("PrepareResources once granted: %v", err)
	}
	checkPrepared(t, resp, qd, claim, gpuNames)
	q.release("pod-q-1", 1)
	q.waitUnprepared(qd, string(claim.UID))
}

// waitPermissionsHealth waits up to timeout until the permissions health
// service reports want: the check logs its outcome just before it sets
// the health, and a re-check comes after 10 s, then 20, 40…
func (n *draNode) waitPermissionsHealth(want healthpb.HealthCheckResponse_ServingStatus, timeout time.Duration) {
	n.t.Helper()
	conn, err := rpcutil.DialPeer(n.dmp.Addr("dramanager"))
	if err != nil {
		n.t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	client := healthpb.NewHealthClient(conn)
	testutil.EventuallyWithin(n.t, timeout, fmt.Sprintf("%s's health of %s %v", n.node, permissionsHealth, want), func() error {
		resp, err := client.Check(ctxT(n.t), &healthpb.HealthCheckRequest{Service: permissionsHealth})
		if err != nil || resp.GetStatus() != want {
			return fmt.Errorf("%v (%v)", resp.GetStatus(), err)
		}
		return nil
	})
}

// waitPermissionsChecked waits for the dramanager's start check and
// returns how many rules it found missing.
func (n *draNode) waitPermissionsChecked() int {
	n.t.Helper()
	var missing float64
	testutil.Eventually(n.t, n.node+"'s permissions checked", func() error {
		lines := n.draProcess().LogLines("permissions checked")
		if len(lines) == 0 {
			return errors.New("not yet")
		}
		m, ok := lines[len(lines)-1]["missing"].(float64)
		if !ok {
			return fmt.Errorf("no missing count in %v", lines[len(lines)-1])
		}
		missing = m
		return nil
	})
	return int(missing)
}

// testThreeNodes is TestCluster's second half: node-a (already running,
// with three devices) and two more nodes, each with its own driver
// instance, share the API server.
func testThreeNodes(t *testing.T, cp *controlPlane, class string, a *draNode, ad *claimsDriver, aDevs []resourcev1.Device) {
	nodes, drivers := []*draNode{a}, []*claimsDriver{ad}
	for _, name := range []string{"node-b", "node-c"} {
		m := startClusterNode(t, cp, name, shortDelay)
		drivers = append(drivers, m.startClaimsDriver(clusterDriver, twoGPUs()))
		nodes = append(nodes, m)
	}
	for i, m := range nodes {
		if i == 0 {
			m.waitSlices(cp.admin, clusterDriver, aDevs)
		} else {
			m.waitSlices(cp.admin, clusterDriver, twoGPUs())
		}
	}

	// Each node allocates from its own slices only (checkPrepared checks
	// the device's pool is the node's).
	own := map[string]*resourcev1.ResourceClaim{}
	for i, m := range nodes {
		claim := m.createClaim(cp.admin, class, "default", "own-"+m.node)
		pod := "pod-own-" + m.node
		resp, err := m.draClient().PrepareResources(ctxT(t), podPrepare(pod, "default", "own", claim.Name))
		if err != nil {
			t.Fatalf("%s: PrepareResources: %v", m.node, err)
		}
		m.checkAllocated(cp.admin, claim, checkPrepared(t, resp, drivers[i], claim, gpuNames), pod)
		own[m.node] = claim
	}
	// nodeplugctl claims lists this node's claims; --all every one, with
	// the node each is allocated to.
	c := nodes[2]
	for _, all := range []bool{false, true} {
		resp, err := c.draClient().ListClaims(ctxT(t), &dmv1.ListClaimsRequest{All: all})
		if err != nil {
			t.Fatal(err)
		}
		byName := map[string]*dmv1.Claim{}
		for _, cl := range resp.GetClaims() {
			byName[cl.GetName()] = cl
		}
		if byName["own-node-c"] == nil || (byName["own-node-a"] != nil) != all {
			t.Fatalf("node-c's ListClaims (all: %v) lists %v", all, slices.Sorted(maps.Keys(byName)))
		}
		if all && byName["own-node-a"].GetAllocatedNode() != "node-a" {
			t.Fatalf("node-a's claim listed on node-c as allocated to %q", byName["own-node-a"].GetAllocatedNode())
		}
	}
	if out := string(c.ctl("claims")); !strings.Contains(out, "own-node-c") || strings.Contains(out, "own-node-a") {
		t.Fatalf("nodeplugctl claims on node-c:\n%s", out)
	}
	if out := string(c.ctl("claims", "--all")); !strings.Contains(out, "own-node-a") || !strings.Contains(out, "own-node-b") {
		t.Fatalf("nodeplugctl claims --all on node-c:\n%s", out)
	}

	// And prepares only claims allocated to it.
	_, err := nodes[1].draClient().PrepareResources(ctxT(t), podPrepare("pod-b-intruder", "default", "intruder", own["node-a"].Name))
	wantCode(t, "node-b's PrepareResources of node-a's claim", err, codes.FailedPrecondition, "node-a", "node-b")

	// Two nodes race to allocate one claim: the API's conflict lets one
	// win; the other says which node holds it.
	for round := range 4 {
		claim := nodes[0].createClaim(cp.admin, class, "default", fmt.Sprintf("contested-%d", round))
		errs := raceNodes(nodes[:2], claim.Name, fmt.Sprintf("race-%d", round), nil)
		winner := slices.IndexFunc(errs, func(err error) bool { return err == nil })
		if winner < 0 || errs[1-winner] == nil {
			t.Fatalf("round %d: node-a %v, node-b %v: want exactly one to prepare the claim", round, errs[0], errs[1])
		}
		loser := 1 - winner
		wantCode(t, nodes[loser].node+"'s losing PrepareResources", errs[loser], codes.FailedPrecondition, nodes[winner].node)
		nodes[winner].checkReservedOnly(cp.admin, claim, fmt.Sprintf("race-%d-%s", round, nodes[winner].node))
		nodes[winner].release(fmt.Sprintf("race-%d-%s", round, nodes[winner].node), 1)
		nodes[winner].waitUnprepared(drivers[winner], string(claim.UID))
		nodes[winner].waitReleasedInAPI(cp.admin, claim)
	}

	// A node's dramanager killed in the middle of a race: once it is back,
	// no claim is reserved by a node that does not hold it.
	for round := range 4 {
		claim := nodes[0].createClaim(cp.admin, class, "default", fmt.Sprintf("chaos-%d", round))
		victim := nodes[round%2]
		raceNodes(nodes[:2], claim.Name, fmt.Sprintf("chaos-%d", round), victim.killDRA)
		victim.startDRA()
		checkHeld(t, cp.admin, nodes)
	}

	// A driver gone: its node's slices alone are deleted.
	if err := drivers[2].proc.Stop(10 * time.Second); err != nil {
		t.Fatalf("stop node-c's driver: %v", err)
	}
	nodes[2].waitNoSlices(cp.admin, clusterDriver)
	for _, m := range nodes[:2] {
		if l, err := m.slices(cp.admin, clusterDriver); err != nil || len(l.Items) != 1 {
			t.Fatalf("%s's slices after node-c's driver left: %v (%v)", m.node, l, err)
		}
	}
}

// raceNodes has each node prepare the claim for a pod of its own
// (prefix-<node>) at once, calling during (if not nil) as they start, and
// returns their errors in nodes' order.
func raceNodes(nodes []*draNode, claim, prefix string, during func()) []error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, m := range nodes {
		client := m.draClient()
		req := podPrepare(prefix+"-"+m.node, "default", prefix, claim)
		wg.Go(func() {
			<-start
			_, errs[i] = client.PrepareResources(ctxT(m.t), req)
		})
	}
	close(start)
	if during != nil {
		during()
	}
	wg.Wait()
	return errs
}

// checkReservedOnly checks the claim is allocated to n and reserved for pod
// alone.
func (n *draNode) checkReservedOnly(cs kubernetes.Interface, claim *resourcev1.ResourceClaim, pod string) {
	n.t.Helper()
	got, err := cs.ResourceV1().ResourceClaims(claim.Namespace).Get(ctxT(n.t), claim.Name, metav1.GetOptions{})
	if err != nil {
		n.t.Fatal(err)
	}
	if node := allocatedNode(got); node != n.node || len(got.Status.ReservedFor) != 1 || string(got.Status.ReservedFor[0].UID) != pod {
		n.t.Fatalf("claim %s allocated to %q, reserved for %v; want %s, [%s]", claim.Name, node, got.Status.ReservedFor, n.node, pod)
	}
}

// allocatedNode is the one node a claim's allocation selects ("" when
// none).
func allocatedNode(c *resourcev1.ResourceClaim) string {
	if c.Status.Allocation == nil || c.Status.Allocation.NodeSelector == nil {
		return ""
	}
	for _, term := range c.Status.Allocation.NodeSelector.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

// checkHeld waits until every claim reserved for a pod is allocated to one
// of nodes, which shows it prepared for that pod, and no claim a node
// allocated is left allocated with no pod: the state a crash must not
// leave behind. Pods the nodes hold are then released.
func checkHeld(t *testing.T, cs kubernetes.Interface, nodes []*draNode) {
	t.Helper()
	byName := map[string]*draNode{}
	for _, m := range nodes {
		byName[m.node] = m
	}
	var held map[*draNode][]string
	testutil.Eventually(t, "every reserved claim held by its node", func() error {
		held = map[*draNode][]string{}
		list, err := cs.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctxT(t), metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, c := range list.Items {
			node := allocatedNode(&c)
			if len(c.Status.ReservedFor) == 0 {
				if by := c.Annotations["nodeplug.io/allocated-by-node"]; by != "" && c.Status.Allocation != nil {
					return fmt.Errorf("claim %s is allocated by %s with no pod", c.Name, by)
				}
				continue
			}
			m := byName[node]
			if m == nil {
				continue // a scheduler's allocation to a node not running here
			}
			listed, err := m.listedClaim(string(c.UID))
			if err != nil {
				return err
			}
			for _, r := range c.Status.ReservedFor {
				if listed == nil || listed.GetState() != dmv1.ClaimState_CLAIM_STATE_PREPARED ||
					!slices.ContainsFunc(listed.GetPods(), func(p *dmv1.ClaimPod) bool { return p.GetUid() == string(r.UID) }) {
					return fmt.Errorf("claim %s is reserved for pod %s but %s shows %v", c.Name, r.UID, node, listed)
				}
				held[m] = append(held[m], string(r.UID))
			}
		}
		return nil
	})
	for m, pods := range held {
		for _, p := range pods {
			if strings.HasPrefix(p, "chaos-") {
				m.release(p, 1)
			}
		}
	}
}

// waitSameSlices waits (afterRestart) until the dramanager's
// ListResourceSlices (its informers' view) holds exactly the node's slices
// the API lists, by name and UID.
func (n *draNode) waitSameSlices(cs kubernetes.Interface) {
	n.t.Helper()
	testutil.EventuallyWithin(n.t, afterRestart, "the dramanager's slices as the API's", func() error {
		api, err := n.slices(cs, clusterDriver)
		if err != nil {
			return err
		}
		resp, err := n.draClient().ListResourceSlices(ctxT(n.t), &dmv1.ListResourceSlicesRequest{})
		if err != nil {
			return err
		}
		var want, got []string
		for _, s := range api.Items {
			want = append(want, s.Name+"/"+string(s.UID))
		}
		for _, s := range resp.GetSlices() {
			if s.GetDriver() == clusterDriver {
				got = append(got, s.GetName()+"/"+s.GetUid())
			}
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(want, got) {
			return fmt.Errorf("dramanager %v, API %v", got, want)
		}
		return nil
	})
}

// checkRelease checks the API server is at the k8s.io release this module
// builds on (k8s.io/api v0.X.Y in its go.mod is Kubernetes v1.X.Y).
func checkRelease(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/api v0\.(\S+)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod requires no k8s.io/api")
	}
	v, err := cs.Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	if want := "v1." + string(m[1]); v.GitVersion != want {
		t.Fatalf("kube-apiserver %s, but this module builds on k8s.io/api v0.%s (Kubernetes %s)", v.GitVersion, m[1], want)
	}
}

// in makes t the test n's helpers fail and log in (a subtest's), until the
// returned func puts the previous one back.
func (n *draNode) in(t *testing.T) func() {
	prev := n.t
	n.t = t
	return func() { n.t = prev }
}

// gpuNames are the devices a claim of the cluster tests may get on a node
// (the third once a test published it).
var gpuNames = []string{"gpu-0", "gpu-1", "gpu-2"}
