package claimalloc

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

func TestAllocatesWithSelectorsCountsAndAllMode(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.slice(gpu, testNode, "a", "gpu-0", "gpu-1", "gpu-2", "gpu-3")
	e.slice(nic, testNode, "x", "nic-0", "nic-1")
	e.slice(gpu, "node-b", "a", "gpu-0", "gpu-1")
	e.class(gpu, gpu)
	e.class(nic, nic)

	// Two GPUs with an odd index, the other node's GPUs not among them.
	two := e.claim("two", req("gpu", gpu, 2, `device.attributes["gpu.example.com"].index % 2 == 1`))
	c, err := e.alloc.Reserve(ctx, pod("p1"), two)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{gpu + "/node-a-a/gpu-1", gpu + "/node-a-a/gpu-3"}
	if got := devicesOf(c); !slices.Equal(got, want) {
		t.Fatalf("devices %v, want %v", got, want)
	}
	stored := e.get(two)
	if !slices.Equal(devicesOf(stored), want) || !slices.Equal(reservedPods(stored), []string{"uid-p1"}) ||
		stored.Status.ReservedFor[0].Name != "p1" || stored.Annotations[AllocatedByAnnotation] != testNode {
		t.Fatalf("stored claim: %+v %+v, want the devices, reserved for p1, marked as allocated by %s", stored.Status, stored.Annotations, testNode)
	}
	if got := selectedNodes(stored.Status.Allocation.NodeSelector); got != "node "+testNode {
		t.Fatalf("the allocation is for %s, want node %s", got, testNode)
	}

	// Mode All: every NIC, in one claim with a GPU request (gets a free one).
	all := e.claim("all", req("nics", nic, 0), req("gpu", gpu, 1))
	c, err = e.alloc.Reserve(ctx, pod("p2"), all)
	if err != nil {
		t.Fatal(err)
	}
	got := devicesOf(c)
	if len(got) != 3 || got[0] != nic+"/node-a-x/nic-0" || got[1] != nic+"/node-a-x/nic-1" || slices.Contains(want, got[2]) {
		t.Fatalf("mode All and one free GPU: %v", got)
	}
	// Reserving again for the same pod changes nothing.
	again, err := e.alloc.Reserve(ctx, pod("p2"), all)
	if err != nil || !slices.Equal(devicesOf(again), got) || len(again.Status.ReservedFor) != 1 || again.ResourceVersion != c.ResourceVersion {
		t.Fatalf("the same reservation again: %v %v, want the claim unchanged", again, err)
	}
	// The NICs are all in use: another mode-All claim cannot have them.
	_, err = e.alloc.Reserve(ctx, pod("p3"), e.claim("all2", req("nics", nic, 0)))
	isErr(t, "mode All with every device in use", err, errdefs.ErrFailedPrecondition)
	if !strings.Contains(err.Error(), `request "nics"`) || !strings.Contains(err.Error(), "2 of the node's 6 device(s) match") ||
		!strings.Contains(err.Error(), "0 of them free") {
		t.Fatalf("reason %q, want the request, the matching and the free devices", err)
	}
}

func TestUnallocatableReasons(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.slice(gpu, testNode, "a", "gpu-0", "gpu-1")
	e.class(gpu, gpu)

	none := e.claim("none", req("big", gpu, 1, `device.attributes["gpu.example.com"].model == "h100"`))
	_, err := e.alloc.Reserve(ctx, pod("p1"), none)
	isErr(t, "a selector matching nothing", err, errdefs.ErrFailedPrecondition)
	t.Log(err)
	for _, s := range []string{"ns/none", testNode, `request "big"`, `class "gpu.example.com"`, "1 device(s)", "0 of the node's 2 device(s) match"} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("reason %q does not name %q", err, s)
		}
	}
	if c := e.get(none); c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 || c.Annotations[AllocatedByAnnotation] != "" {
		t.Fatalf("a failed allocation left %+v %v", c.Status, c.Annotations)
	}

	_, err = e.alloc.Reserve(ctx, pod("p1"), e.claim("three", req("gpus", gpu, 3)))
	isErr(t, "more devices than the node has", err, errdefs.ErrFailedPrecondition)
	if !strings.Contains(err.Error(), "3 device(s)") || !strings.Contains(err.Error(), "2 of the node's 2 device(s) match the class's and the request's selectors, 2 of them free") {
		t.Fatalf("reason %q", err)
	}

	_, err = e.alloc.Reserve(ctx, pod("p1"), e.claim("noclass", req("x", "missing.example.com", 1)))
	isErr(t, "a class that does not exist", err, errdefs.ErrFailedPrecondition)
	t.Log(err)
	if !strings.Contains(err.Error(), "missing.example.com") {
		t.Fatalf("reason %q does not name the class", err)
	}

	_, err = e.alloc.Reserve(ctx, pod("p1"), e.claim("badcel", req("x", gpu, 1, `device.attributes["gpu.example.com"].model > 3`)))
	isErr(t, "a selector that does not evaluate", err, errdefs.ErrFailedPrecondition)
	t.Log(err)
	if !strings.Contains(err.Error(), "selector #0") || !strings.Contains(err.Error(), "no such overload") {
		t.Fatalf("reason %q does not name the selector's problem", err)
	}
}

func TestBadReferences(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.slice(gpu, testNode, "a", "gpu-0")
	e.class(gpu, gpu)
	ref := e.claim("c", req("gpu", gpu, 1))

	_, err := e.alloc.Reserve(ctx, pod("p"), claims.ClaimRef{Namespace: "ns", Name: "missing"})
	isErr(t, "a missing claim", err, errdefs.ErrNotFound)
	wrong := ref
	wrong.UID = "another-uid"
	_, err = e.alloc.Reserve(ctx, pod("p"), wrong)
	isErr(t, "another UID", err, errdefs.ErrFailedPrecondition)
	if !strings.Contains(err.Error(), "another-uid") || !strings.Contains(err.Error(), ref.UID) {
		t.Fatalf("UID mismatch %q does not name both UIDs", err)
	}
	_, err = e.alloc.Reserve(ctx, claims.PodRef{Name: "p"}, ref)
	isErr(t, "no pod UID", err, errdefs.ErrInvalidArgument)
	if err := e.alloc.Unreserve(ctx, pod("p"), wrong); err != nil {
		t.Fatalf("unreserving a claim whose UID differs: %v, want success", err)
	}
	if err := e.alloc.Unreserve(ctx, pod("p"), claims.ClaimRef{Namespace: "ns", Name: "missing"}); err != nil {
		t.Fatalf("unreserving a claim that is gone: %v, want success", err)
	}
	if _, err := New(nil, testNode, nil); err == nil {
		t.Fatal("New without a client succeeded")
	}

	e.stop()
	_, err = e.alloc.Reserve(ctx, pod("p"), ref)
	isErr(t, "the API stopped", err, errdefs.ErrUnavailable)
	t.Log(err)
	isErr(t, "unreserve, the API stopped", e.alloc.Unreserve(ctx, pod("p"), ref), errdefs.ErrUnavailable)
}

func TestAllocatedElsewhere(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.slice(gpu, testNode, "a", "gpu-0", "gpu-1")
	e.class(gpu, gpu)

	// Allocated to node-b by a scheduler: refused, naming node-b.
	other := e.claim("other", req("gpu", gpu, 1))
	e.allocate(other, forNode("node-b", "gpu-0"))
	_, err := e.alloc.Reserve(ctx, pod("p1"), other)
	isErr(t, "a claim allocated to another node", err, errdefs.ErrFailedPrecondition)
	t.Log(err)
	if !strings.Contains(err.Error(), "node node-b") || !strings.Contains(err.Error(), testNode) {
		t.Fatalf("reason %q does not name both nodes", err)
	}

	// Allocated to this node by a scheduler: used as it is, never
	// deallocated here; its device is in use for this node's allocations.
	sched := e.claim("sched", req("gpu", gpu, 1))
	e.allocate(sched, forNode(testNode, "gpu-0"))
	c, err := e.alloc.Reserve(ctx, pod("p1"), sched)
	if err != nil || !slices.Equal(devicesOf(c), []string{gpu + "/node-a-a/gpu-0"}) || !slices.Equal(reservedPods(c), []string{"uid-p1"}) {
		t.Fatalf("a claim allocated to this node: %v %v", c, err)
	}
	mine, err := e.alloc.Reserve(ctx, pod("p2"), e.claim("mine", req("gpu", gpu, 1)))
	if err != nil || !slices.Equal(devicesOf(mine), []string{gpu + "/node-a-a/gpu-1"}) {
		t.Fatalf("allocation beside the scheduler's claim: %v %v, want gpu-1 (gpu-0 is in use)", mine, err)
	}
	if err := e.alloc.Unreserve(ctx, pod("p1"), sched); err != nil {
		t.Fatal(err)
	}
	if c := e.get(sched); c.Status.Allocation == nil || len(c.Status.ReservedFor) != 0 {
		t.Fatalf("after its last pod: %+v, want the scheduler's allocation kept and no reservation", c.Status)
	}
}

// allocate writes an allocation as a scheduler would.
func (e *env) allocate(ref claims.ClaimRef, alloc *resourcev1.AllocationResult) {
	e.t.Helper()
	c := e.get(ref)
	c.Status.Allocation = alloc
	if _, err := e.client.ResourceV1().ResourceClaims(ref.Namespace).UpdateStatus(context.Background(), c, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func TestSharedClaimAndUnreserve(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.slice(gpu, testNode, "a", "gpu-0", "gpu-1")
	e.class(gpu, gpu)
	shared := e.claim("shared", req("gpu", gpu, 1))

	c1, err := e.alloc.Reserve(ctx, pod("p1"), shared)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := e.alloc.Reserve(ctx, pod("p2"), shared)
	if err != nil || !slices.Equal(devicesOf(c2), devicesOf(c1)) || !slices.Equal(reservedPods(c2), []string{"uid-p1", "uid-p2"}) {
		t.Fatalf("the second pod: %v %v, want the same allocation reserved for both", c2, err)
	}
	if err := e.alloc.Unreserve(ctx, pod("p1"), shared); err != nil {
		t.Fatal(err)
	}
	if c := e.get(shared); !slices.Equal(devicesOf(c), devicesOf(c1)) || !slices.Equal(reservedPods(c), []string{"uid-p2"}) {
		t.Fatalf("after the first pod: %+v, want still allocated, reserved for p2", c.Status)
	}
	// An unknown pod changes nothing.
	if err := e.alloc.Unreserve(ctx, pod("nobody"), shared); err != nil {
		t.Fatal(err)
	}
	if c := e.get(shared); c.Status.Allocation == nil || len(c.Status.ReservedFor) != 1 {
		t.Fatalf("after an unknown pod: %+v", c.Status)
	}
	if err := e.alloc.Unreserve(ctx, pod("p2"), shared); err != nil {
		t.Fatal(err)
	}
	c := e.get(shared)
	if c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 || c.Annotations[AllocatedByAnnotation] != "" {
		t.Fatalf("after the last pod: %+v %v, want deallocated and unmarked", c.Status, c.Annotations)
	}
	if err := e.alloc.Unreserve(ctx, pod("p2"), shared); err != nil {
		t.Fatalf("unreserving again: %v", err)
	}
	// Its device is free again: two claims of one device each fit.
	for _, n := range []string{"a", "b"} {
		if _, err := e.alloc.Reserve(ctx, pod(n), e.claim(n, req("gpu", gpu, 1))); err != nil {
			t.Fatalf("claim %s after the deallocation: %v", n, err)
		}
	}
}

func TestConcurrentReservesNeverShareADevice(t *testing.T) {
	e := newEnv(t)
	e.slice(gpu, testNode, "a", "gpu-0", "gpu-1", "gpu-2", "gpu-3")
	e.class(gpu, gpu)
	const n = 6
	refs := make([]claims.ClaimRef, n)
	for i := range refs {
		refs[i] = e.claim(fmt.Sprintf("c%d", i), req("gpu", gpu, 1))
	}
	shared := e.claim("shared", req("gpu", gpu, 1))
	var wg sync.WaitGroup
	errs := make([]error, n)
	sharedErrs := make([]error, 4)
	for i := range refs {
		wg.Go(func() { _, errs[i] = e.alloc.Reserve(context.Background(), pod(fmt.Sprint(i)), refs[i]) })
	}
	for i := range sharedErrs {
		wg.Go(func() { _, sharedErrs[i] = e.alloc.Reserve(context.Background(), pod(fmt.Sprint("s", i)), shared) })
	}
	wg.Wait()
	for i, err := range sharedErrs {
		if err != nil && !strings.Contains(err.Error(), "cannot be allocated") {
			t.Fatalf("shared claim, pod s%d: %v", i, err)
		}
	}
	used := map[string]string{}
	ok := 0
	for _, ref := range append(refs, shared) {
		c := e.get(ref)
		for _, d := range devicesOf(c) {
			if prev, dup := used[d]; dup {
				t.Fatalf("device %s allocated to both %s and %s", d, prev, ref.Name)
			}
			used[d] = ref.Name
			ok++
		}
	}
	if ok != 4 {
		t.Fatalf("%d devices allocated (%v), want all 4", ok, used)
	}
	for i, err := range errs {
		if err != nil {
			isErr(t, fmt.Sprint("claim c", i), err, errdefs.ErrFailedPrecondition)
		}
	}
	if c := e.get(shared); c.Status.Allocation != nil {
		var want []string
		for i, err := range sharedErrs {
			if err == nil {
				want = append(want, fmt.Sprint("uid-s", i))
			}
		}
		if got := reservedPods(c); len(got) != len(want) || len(want) == 0 {
			t.Fatalf("shared claim reserved for %v, want the pods whose Reserve succeeded %v", got, want)
		}
	}
}

// Two Allocators of one node (as an old and a new dramanager overlapping
// for a moment) reserving one claim at once: the claim's resourceVersion
// keeps their writes apart (409, read again), so it is allocated once and
// reserved for both pods.
func TestConflictingWritersOfOneClaim(t *testing.T) {
	e := newEnv(t)
	e.slice(gpu, testNode, "a", "gpu-0", "gpu-1", "gpu-2")
	e.class(gpu, gpu)
	other, err := New(e.client, testNode, nil)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 3 {
		ref := e.claim(fmt.Sprint("c", round), req("gpu", gpu, 1))
		var wg sync.WaitGroup
		results := make([]*resourcev1.ResourceClaim, 2)
		errs := make([]error, 2)
		for i, al := range []*Allocator{e.alloc, other} {
			wg.Go(func() { results[i], errs[i] = al.Reserve(context.Background(), pod(fmt.Sprint(round, "-", i)), ref) })
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("round %d: %v %v", round, errs[0], errs[1])
		}
		c := e.get(ref)
		if got := reservedPods(c); len(got) != 2 || len(devicesOf(c)) != 1 {
			t.Fatalf("round %d: %+v, want one device reserved for both pods", round, c.Status)
		}
		for i, r := range results {
			if !slices.Equal(devicesOf(r), devicesOf(c)) {
				t.Fatalf("round %d: Reserve %d returned %v, the claim has %v", round, i, devicesOf(r), devicesOf(c))
			}
		}
		// Free it for the next round.
		for i := range 2 {
			if err := e.alloc.Unreserve(context.Background(), pod(fmt.Sprint(round, "-", i)), ref); err != nil {
				t.Fatal(err)
			}
		}
	}
}
