package claimalloc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

// Many callers allocating and deallocating at once (each a claim reserved,
// held, unreserved, again) never hold one device together: while a caller
// holds its claim's devices (from Reserve's return to the Unreserve), no
// other claim is given them. With the informers the allocator's own writes
// count before the informer shows them; without, each decision lists.
func TestConcurrentChurnNeverDoubleAllocates(t *testing.T) {
	for _, follow := range []bool{true, false} {
		t.Run(fmt.Sprintf("informers=%v", follow), func(t *testing.T) {
			e := newEnvWith(t, follow)
			var names []string
			for i := range 12 {
				names = append(names, fmt.Sprintf("gpu-%d", i))
			}
			e.slice(gpu, testNode, "a", names...)
			e.class(gpu, gpu)
			const callers, rounds = 10, 6
			refs := make([][]claims.ClaimRef, callers)
			for c := range callers {
				for r := range rounds {
					count := int64(1 + (c+r)%2) // one or two devices
					refs[c] = append(refs[c], e.claim(fmt.Sprintf("c%d-%d", c, r), req("gpu", gpu, count)))
				}
			}
			var mu sync.Mutex
			held := map[string]string{} // device: the claim holding it
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			allocated := make([]int, callers)
			for c := range callers {
				wg.Go(func() {
					for r, ref := range refs[c] {
						p := pod(fmt.Sprintf("p%d-%d", c, r))
						got, err := e.alloc.Reserve(context.Background(), p, ref)
						if errors.Is(err, errdefs.ErrFailedPrecondition) {
							continue // every device held at the moment
						}
						if err != nil {
							errs <- fmt.Errorf("reserve %s: %w", ref.Name, err)
							return
						}
						allocated[c]++
						mu.Lock()
						for _, d := range devicesOf(got) {
							if other, dup := held[d]; dup {
								mu.Unlock()
								errs <- fmt.Errorf("device %s given to %s while %s holds it", d, ref.Name, other)
								return
							}
							held[d] = ref.Name
						}
						mu.Unlock()
						// Held until here: the other callers allocate meanwhile.
						if _, err := e.alloc.Reserve(context.Background(), p, ref); err != nil {
							errs <- fmt.Errorf("reserve %s again: %w", ref.Name, err)
							return
						}
						mu.Lock()
						for _, d := range devicesOf(got) {
							delete(held, d)
						}
						mu.Unlock()
						if err := e.alloc.Unreserve(context.Background(), p, ref); err != nil {
							errs <- fmt.Errorf("unreserve %s: %w", ref.Name, err)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			total := 0
			for _, n := range allocated {
				total += n
			}
			if total == 0 {
				t.Fatal("no claim was allocated")
			}
			t.Logf("%d of %d claims allocated", total, callers*rounds)
			for _, rs := range refs {
				for _, ref := range rs {
					if c := e.get(ref); c.Status.Allocation != nil {
						t.Errorf("claim %s still allocated after its Unreserve: %v", ref.Name, devicesOf(c))
					}
				}
			}
		})
	}
}

// Many claims allocated at once and kept: every device goes to one claim,
// each exactly once, the rest refused.
func TestConcurrentAllocationsFillTheNodeOnce(t *testing.T) {
	e := newEnv(t)
	var names []string
	for i := range 16 {
		names = append(names, fmt.Sprintf("gpu-%d", i))
	}
	e.slice(gpu, testNode, "a", names...)
	e.class(gpu, gpu)
	const n = 24
	refs := make([]claims.ClaimRef, n)
	for i := range refs {
		refs[i] = e.claim(fmt.Sprintf("c%d", i), req("gpu", gpu, 1))
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range refs {
		wg.Go(func() { _, errs[i] = e.alloc.Reserve(context.Background(), pod(fmt.Sprint(i)), refs[i]) })
	}
	wg.Wait()
	used := map[string]string{}
	for i, ref := range refs {
		if errs[i] != nil {
			isErr(t, "claim "+ref.Name, errs[i], errdefs.ErrFailedPrecondition)
			continue
		}
		for _, d := range devicesOf(e.get(ref)) {
			if prev, dup := used[d]; dup {
				t.Fatalf("device %s allocated to both %s and %s", d, prev, ref.Name)
			}
			used[d] = ref.Name
		}
	}
	if len(used) != 16 {
		t.Fatalf("%d devices allocated, want all 16: %v", len(used), used)
	}
}

// inUse says whether the allocator counts a device ("driver/pool/device")
// as in use.
func (e *env) inUse(device string) bool {
	p := strings.SplitN(device, "/", 3)
	return e.alloc.track.state().AllocatedDevices.Has(structured.MakeDeviceID(p[0], p[1], p[2]))
}

// A deallocation frees the devices for the next allocation: one made here
// at once; one made elsewhere (a scheduler's claim deallocated, a claim
// deleted) once the informer shows it, and before that from the API.
func TestDeallocationFreesDevices(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.slice(gpu, testNode, "a", "gpu-0", "gpu-1")
	e.class(gpu, gpu)
	e.viewed()
	a, b := e.claim("a", req("gpu", gpu, 1)), e.claim("b", req("gpu", gpu, 1))
	for _, ref := range []claims.ClaimRef{a, b} {
		if _, err := e.alloc.Reserve(ctx, pod(ref.Name), ref); err != nil {
			t.Fatal(err)
		}
	}
	if e.alloc.fromAPI.Load() != 0 {
		t.Fatalf("%d decisions made from the API, want all from the informers", e.alloc.fromAPI.Load())
	}
	c := e.claim("c", req("gpu", gpu, 1))
	_, err := e.alloc.Reserve(ctx, pod("c"), c)
	isErr(t, "every device in use", err, errdefs.ErrFailedPrecondition)

	// Deallocated here: free for the next decision, from the informers.
	freed := devicesOf(e.get(a))
	if err := e.alloc.Unreserve(ctx, pod("a"), a); err != nil {
		t.Fatal(err)
	}
	before := e.alloc.fromAPI.Load()
	got, err := e.alloc.Reserve(ctx, pod("c"), c)
	if err != nil || !slices.Equal(devicesOf(got), freed) {
		t.Fatalf("after a's deallocation: %v %v, want a's device %v", devicesOf(got), err, freed)
	}
	if n := e.alloc.fromAPI.Load() - before; n != 0 {
		t.Fatalf("the allocation after a deallocation made here was decided from the API (%d)", n)
	}

	// Deallocated by someone else (as a scheduler would): free once the
	// informer shows it.
	freed = devicesOf(e.get(b))
	cb := e.get(b)
	cb.Status.Allocation, cb.Status.ReservedFor = nil, nil
	if _, err := e.client.ResourceV1().ResourceClaims("ns").UpdateStatus(ctx, cb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "b's device free in the allocator's view", func() bool { return !e.inUse(freed[0]) })
	d := e.claim("d", req("gpu", gpu, 1))
	if got, err := e.alloc.Reserve(ctx, pod("d"), d); err != nil || !slices.Equal(devicesOf(got), freed) {
		t.Fatalf("after b's deallocation elsewhere: %v %v, want %v", devicesOf(got), err, freed)
	}

	// Deleted: its devices free once the informer shows the deletion.
	freed = devicesOf(e.get(d))
	if err := e.client.ResourceV1().ResourceClaims("ns").Delete(ctx, "d", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "d's device free in the allocator's view", func() bool { return !e.inUse(freed[0]) })
	if got, err := e.alloc.Reserve(ctx, pod("e"), e.claim("e", req("gpu", gpu, 1))); err != nil || !slices.Equal(devicesOf(got), freed) {
		t.Fatalf("after d's deletion: %v %v, want %v", devicesOf(got), err, freed)
	}

}

// A decision the informers' view cannot satisfy is made again from the
// API: here a deallocation made elsewhere that the view never shows (its
// stores are fixed, no informer feeds them).
func TestDecisionFromTheAPIWhenTheViewFindsNone(t *testing.T) {
	e := newEnvWith(t, false)
	ctx := context.Background()
	e.slice(gpu, testNode, "a", "gpu-0")
	e.class(gpu, gpu)
	fixed := &caches{node: cache.NewStore(cache.MetaNamespaceKeyFunc), nodeSlices: cache.NewStore(cache.MetaNamespaceKeyFunc),
		otherSlices: cache.NewStore(cache.MetaNamespaceKeyFunc), classes: cache.NewStore(cache.MetaNamespaceKeyFunc)}
	node, err := e.client.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sl, err := e.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := e.client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	add := func(s cache.Store, obj any) {
		if err := s.Add(obj); err != nil {
			t.Fatal(err)
		}
	}
	add(fixed.node, node)
	for i := range sl.Items {
		add(fixed.nodeSlices, &sl.Items[i])
	}
	for i := range cl.Items {
		add(fixed.classes, &cl.Items[i])
	}
	e.alloc.cached.Store(fixed)

	x := e.claim("x", req("gpu", gpu, 1))
	if _, err := e.alloc.Reserve(ctx, pod("x"), x); err != nil {
		t.Fatal(err)
	}
	if n := e.alloc.fromAPI.Load(); n != 0 {
		t.Fatalf("%d decisions from the API, want the first from the view", n)
	}
	cx := e.get(x)
	cx.Status.Allocation, cx.Status.ReservedFor = nil, nil
	if _, err := e.client.ResourceV1().ResourceClaims("ns").UpdateStatus(ctx, cx, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := e.alloc.Reserve(ctx, pod("y"), e.claim("y", req("gpu", gpu, 1)))
	if err != nil || !slices.Equal(devicesOf(got), []string{gpu + "/node-a-a/gpu-0"}) {
		t.Fatalf("after x's deallocation elsewhere, unseen by the view: %v %v, want gpu-0", devicesOf(got), err)
	}
	if n := e.alloc.fromAPI.Load(); n != 1 {
		t.Fatalf("%d decisions from the API, want 1", n)
	}
	// Nothing free, in the view or the API: the reason is the API's.
	_, err = e.alloc.Reserve(ctx, pod("z"), e.claim("z", req("gpu", gpu, 1)))
	isErr(t, "every device in use", err, errdefs.ErrFailedPrecondition)
	if !strings.Contains(err.Error(), "1 of the node's 1 device(s) match the class's and the request's selectors, 0 of them free") {
		t.Fatalf("reason %q", err)
	}
}

func claimAt(uid, rv string, devices ...string) *resourcev1.ResourceClaim {
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), ResourceVersion: rv}}
	if devices != nil {
		c.Status.Allocation = forNode(testNode, devices...)
	}
	return c
}

// The tracker keeps the newest version of each claim, whatever the order
// its versions arrive in; a pending allocation counts until its write's
// outcome; a deleted claim does not come back.
func TestTrackerVersions(t *testing.T) {
	tr := newTracker()
	has := func(d string) bool {
		return tr.state().AllocatedDevices.Has(structured.MakeDeviceID(gpu, testNode+"-a", d))
	}
	tr.observe(claimAt("u1", "5", "gpu-0"))
	tr.observe(claimAt("u1", "4")) // older: ignored
	if !has("gpu-0") {
		t.Fatal("an older version undid a newer allocation")
	}
	tr.observe(claimAt("u1", "7"))
	tr.observe(claimAt("u1", "5", "gpu-0"))
	if has("gpu-0") {
		t.Fatal("an older allocation came back after the deallocation")
	}

	// Pending: in use whatever arrives, until written.
	written := tr.assume("u2", forNode(testNode, "gpu-1"))
	if tr.pendingFor("u2") == nil || !has("gpu-1") {
		t.Fatal("a pending allocation is not in use")
	}
	tr.observe(claimAt("u2", "9")) // the marker's version
	if !has("gpu-1") {
		t.Fatal("a version without the allocation undid a pending one")
	}
	written(claimAt("u2", "10", "gpu-1"))
	if tr.pendingFor("u2") != nil || !has("gpu-1") {
		t.Fatal("the written allocation is not in use")
	}
	tr.observe(claimAt("u2", "9"))
	if !has("gpu-1") {
		t.Fatal("the marker's version, arriving late, undid the written allocation")
	}
	// A failed write frees the devices.
	failed := tr.assume("u3", forNode(testNode, "gpu-2"))
	failed(nil)
	if has("gpu-2") || len(tr.claims) != 2 {
		t.Fatalf("a failed write left its devices in use (%d claims tracked)", len(tr.claims))
	}

	// Deleted: a version read before the deletion, noted after it, does
	// not bring it back.
	tr.forget("u2")
	tr.observe(claimAt("u2", "10", "gpu-1"))
	if has("gpu-1") {
		t.Fatal("a deleted claim came back")
	}

	// A fresh list drops what it does not hold, up to its version.
	tr.observe(claimAt("u4", "20", "gpu-3"))
	tr.observe(claimAt("u5", "30", "gpu-4"))
	tr.reconcile(nil, "25")
	if has("gpu-3") || !has("gpu-4") {
		t.Fatal("a list at 25 without u4 (20) and u5 (30): want u4 gone, u5 kept")
	}
}
