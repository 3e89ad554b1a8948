package claimview_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimview"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

const (
	gpu = "gpu.example.com"
	// other is another node sharing the API.
	other = "node-2"
)

// env is a node on an API it shares with other nodes: the node-local
// resource API (real), a DRA driver on the upstream helper with a pool of
// devices (class "gpu"; class "none" selects no device), the registry,
// claimalloc, the claims manager over a journal, and the view over them
// (SharedAPI).
type env struct {
	t      *testing.T
	api    *dratest.API
	reg    *drivers.Registry
	plugin *dratest.Plugin
	mgr    *claims.Manager
	view   *claimview.View
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	root := testutil.TempDir(t)
	e := &env{t: t, api: dratest.StartAPI(t, root), plugin: dratest.NewPlugin(gpu)}
	reg, err := drivers.New(drivers.Config{Client: e.api.Client, NodeName: dratest.Node, AllowedDirs: []string{root}})
	if err != nil {
		t.Fatal(err)
	}
	reg.Start()
	t.Cleanup(reg.Close)
	e.reg = reg
	d := dratest.StartDriverWith(t, e.api, gpu, "", e.plugin)
	d.Publish(t, 32)
	dratest.WaitSlices(t, e.api.Client, gpu, 1, 32)
	for name, driver := range map[string]string{"gpu": gpu, "none": "none.example.com"} {
		dc := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourcev1.DeviceClassSpec{
			Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + driver + `"`}}},
		}}
		if _, err := e.api.Client.ResourceV1().DeviceClasses().Create(ctx, dc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := reg.Register(ctx, drivers.Registration{Driver: gpu, Endpoint: d.Endpoint, Services: d.Services,
		SocketPath: d.RegSocket, Generation: d.Generation(t)}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "driver "+gpu+" connected", func() error {
		for _, di := range reg.Drivers(gpu) {
			for _, in := range di.Instances {
				if in.Connected {
					return nil
				}
			}
		}
		return errors.New("not connected")
	})
	dir := filepath.Join(root, "dra-manager")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	j := claims.NewJournal(store.New(dir, store.Options{}))
	if _, err := j.Load(); err != nil {
		t.Fatal(err)
	}
	res, err := claimalloc.New(e.api.Client, dratest.Node, nil)
	if err != nil {
		t.Fatal(err)
	}
	e.mgr, err = claims.New(claims.Config{Reserver: res, Drivers: reg, Journal: j, RetryInitial: 10 * time.Millisecond,
		AllocatedHere: func(c *resourcev1.ResourceClaim) bool {
			return c.Annotations[claimalloc.AllocatedByAnnotation] == dratest.Node
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		e.mgr.Close()
		if err := j.Flush(); err != nil {
			t.Error(err)
		}
	})
	e.view = claimview.New(e.api.Client, dratest.Node, e.mgr, reg, claimview.SharedAPI(true))
	return e
}

// claim creates namespace/name asking for one device of class.
func (e *env) claim(t *testing.T, namespace, name, class string) {
	t.Helper()
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name}}
	c.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class}}}
	if _, err := e.api.Client.ResourceV1().ResourceClaims(namespace).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// claimOfOther creates namespace/name as another node leaves a claim it
// allocated: marked as its own, its allocation's node selector naming it.
func (e *env) claimOfOther(t *testing.T, namespace, name string) {
	t.Helper()
	ctx := context.Background()
	c := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
		Annotations: map[string]string{claimalloc.AllocatedByAnnotation: other}}}
	c.Spec.Devices.Requests = []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu"}}}
	c, err := e.api.Client.ResourceV1().ResourceClaims(namespace).Create(ctx, c, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.Status.Allocation = &resourcev1.AllocationResult{
		Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: gpu, Pool: other, Device: "dev-0"}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{other}}}}}},
	}
	if _, err := e.api.Client.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// run is one run of a history: its namespace, the suffix of its claims'
// and pods' names (unique to the run: pod UIDs, and the driver's
// failures by claim name, are the node's), and what it does through the
// view as the dramanager does it (PrepareResources, ReleasePodClaims).
type run struct {
	*env
	t         *testing.T
	namespace string
	suffix    string
}

func (r *run) name(base string) string { return base + r.suffix }

// pod is the request of pod base for the claims bases, one container
// using them all.
func (r *run) pod(base string, bases ...string) claims.PrepareRequest {
	req := claims.PrepareRequest{Pod: claims.PodRef{UID: "uid-" + r.name(base), Namespace: r.namespace, Name: r.name(base)},
		Containers: []claims.ContainerClaims{{Container: "main"}}}
	for i, b := range bases {
		pc := fmt.Sprintf("c%d", i)
		req.PodClaims = append(req.PodClaims, claims.PodClaim{Name: pc, ResourceClaimName: r.name(b)})
		req.Containers[0].Claims = append(req.Containers[0].Claims, claims.ContainerClaim{Name: pc})
	}
	return req
}

func (r *run) claim(base, class string) { r.env.claim(r.t, r.namespace, r.name(base), class) }

// failing makes the driver fail to prepare claim base ("" stops it).
func (r *run) failing(base, msg string) { r.plugin.Fail(r.name(base), msg) }

func (r *run) prepare(pod string, bases ...string) {
	r.t.Helper()
	if _, err := r.view.Prepare(context.Background(), r.pod(pod, bases...)); err != nil {
		r.t.Fatalf("prepare of pod %s: %v", r.name(pod), err)
	}
}

func (r *run) prepareFails(pod string, bases ...string) {
	r.t.Helper()
	if _, err := r.view.Prepare(context.Background(), r.pod(pod, bases...)); err == nil {
		r.t.Fatalf("prepare of pod %s succeeded, want it to fail", r.name(pod))
	}
}

func (r *run) release(pod string) {
	r.t.Helper()
	if _, err := r.view.ReleasePod(context.Background(), "uid-"+r.name(pod)); err != nil {
		r.t.Fatalf("release of pod %s: %v", r.name(pod), err)
	}
}

// settle waits until the claims manager owes nothing for the run's
// claims: no unprepare (of a released claim) is left, nor a rollback.
func (r *run) settle(bases []string) {
	r.t.Helper()
	testutil.WaitFor(r.t, "the unprepares of "+r.namespace+r.suffix+" done", func() bool {
		for _, c := range r.mgr.List() {
			if c.Ref.Namespace == r.namespace && c.State != claims.StatePrepared && slices.Contains(bases, strings.TrimSuffix(c.Ref.Name, r.suffix)) {
				return false
			}
		}
		return true
	})
}

// seen is what ListClaims shows of one claim: its state, whether it is
// listed without all (it concerns this node), the node of its
// allocation, and a part of its reason ("": none).
type seen struct {
	State  claimview.State
	Mine   bool
	Node   string
	Reason string
}

// observe lists the run's namespace, without and with all, and returns
// what they show of the claims bases; the reason is reduced to the part
// of want's reason it holds (so that runs compare equal).
func (r *run) observe(want map[string]seen) map[string]seen {
	r.t.Helper()
	ctx := context.Background()
	mine, err := r.view.List(ctx, claimview.ListOptions{Namespace: r.namespace})
	if err != nil {
		r.t.Fatal(err)
	}
	all, err := r.view.List(ctx, claimview.ListOptions{Namespace: r.namespace, All: true})
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]seen{}
	for base, w := range want {
		i := slices.IndexFunc(all, func(c claimview.Claim) bool { return c.Name == r.name(base) })
		if i < 0 {
			r.t.Fatalf("claim %s/%s not listed with all", r.namespace, r.name(base))
		}
		c := all[i]
		s := seen{State: c.State, Node: c.AllocatedNode, Reason: c.Reason,
			Mine: slices.ContainsFunc(mine, func(m claimview.Claim) bool { return m.UID == c.UID })}
		if w.Reason != "" && strings.Contains(c.Reason, w.Reason) {
			s.Reason = w.Reason
		}
		out[base] = s
	}
	return out
}

// runs is how many times each history runs.
const runs = 12

// Each history of prepares and releases ends in one state per claim, the
// same in every run, whatever runs beside it: the histories run at once
// on one node, each again and again. After a failed prepare a claim is
// failed until the pod's prepare succeeds or the pod is released; then
// the claim's status says (pending: the failed prepare's allocation was
// rolled back); a claim that prepared in the same call as a failed one is
// prepared; a claim another node allocated is allocated, with its node,
// and concerns this node only while a failed prepare here names it.
func TestSameHistorySameState(t *testing.T) {
	e := newEnv(t)
	pending := seen{State: claimview.Pending}
	failed := func(why string) seen { return seen{State: claimview.Failed, Mine: true, Reason: why} }
	elsewhere := seen{State: claimview.Allocated, Node: other, Reason: "allocated to node " + other}
	histories := []struct {
		name    string
		history func(r *run)
		want    map[string]seen
	}{{
		name:    "prepare fails: no device fits",
		history: func(r *run) { r.claim("a", "none"); r.prepareFails("p1", "a") },
		want:    map[string]seen{"a": failed("cannot be allocated")},
	}, {
		name: "prepare fails: the driver's error",
		history: func(r *run) {
			r.claim("a", "gpu")
			r.failing("a", "the device is on fire")
			r.prepareFails("p1", "a")
		},
		want: map[string]seen{"a": failed("the device is on fire")},
	}, {
		name: "prepare fails, the pod is released",
		history: func(r *run) {
			r.claim("a", "gpu")
			r.failing("a", "the device is on fire")
			r.prepareFails("p1", "a")
			r.release("p1")
		},
		want: map[string]seen{"a": pending},
	}, {
		name: "prepare fails, then succeeds",
		history: func(r *run) {
			r.claim("a", "gpu")
			r.failing("a", "the device is on fire")
			r.prepareFails("p1", "a")
			r.failing("a", "")
			r.prepare("p1", "a")
		},
		want: map[string]seen{"a": {State: claimview.Prepared, Mine: true, Node: dratest.Node}},
	}, {
		name: "prepare fails, another pod's succeeds and is released",
		history: func(r *run) {
			r.claim("a", "gpu")
			r.failing("a", "the device is on fire")
			r.prepareFails("p1", "a")
			r.failing("a", "")
			r.prepare("p2", "a")
			r.release("p2")
		},
		want: map[string]seen{"a": failed("the device is on fire")},
	}, {
		name: "prepare fails for one of the pod's claims",
		history: func(r *run) {
			r.claim("a", "gpu")
			r.claim("b", "gpu")
			r.failing("b", "the device is on fire")
			r.prepareFails("p1", "a", "b")
		},
		want: map[string]seen{"a": {State: claimview.Prepared, Mine: true, Node: dratest.Node}, "b": failed("the device is on fire")},
	}, {
		name: "prepare fails for one of the pod's claims, the pod is released",
		history: func(r *run) {
			r.claim("a", "gpu")
			r.claim("b", "gpu")
			r.failing("b", "the device is on fire")
			r.prepareFails("p1", "a", "b")
			r.release("p1")
		},
		want: map[string]seen{"a": pending, "b": pending},
	}, {
		name:    "another node allocated it",
		history: func(r *run) { r.claimOfOther(r.t, r.namespace, r.name("a")) },
		want:    map[string]seen{"a": elsewhere},
	}, {
		name: "another node allocated it, prepare fails",
		history: func(r *run) {
			r.claimOfOther(r.t, r.namespace, r.name("a"))
			r.prepareFails("p1", "a")
		},
		want: map[string]seen{"a": {State: claimview.Failed, Mine: true, Node: other, Reason: "not to this node"}},
	}, {
		name: "another node allocated it, prepare fails, the pod is released",
		history: func(r *run) {
			r.claimOfOther(r.t, r.namespace, r.name("a"))
			r.prepareFails("p1", "a")
			r.release("p1")
		},
		want: map[string]seen{"a": elsewhere},
	}, {
		name: "prepare fails, the claim is created again",
		history: func(r *run) {
			r.claim("a", "none")
			r.prepareFails("p1", "a")
			if err := r.api.Client.ResourceV1().ResourceClaims(r.namespace).Delete(context.Background(), r.name("a"), metav1.DeleteOptions{}); err != nil {
				r.t.Fatal(err)
			}
			r.claim("a", "none")
		},
		want: map[string]seen{"a": pending},
	}}
	for i := range histories {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("h%d", i)}}
		if _, err := e.api.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i, h := range histories {
		t.Run(h.name, func(t *testing.T) {
			t.Parallel()
			results := map[string]int{} // what the runs saw, by how many
			for n := range runs {
				r := &run{env: e, t: t, namespace: fmt.Sprintf("h%d", i), suffix: fmt.Sprintf("-h%d-%d", i, n)}
				h.history(r)
				r.settle(slices.Collect(maps.Keys(h.want)))
				results[fmt.Sprintf("%+v", r.observe(h.want))]++
			}
			if want := fmt.Sprintf("%+v", h.want); results[want] != runs {
				t.Errorf("in %d runs, saw %v; want in every run %s", runs, results, want)
			}
		})
	}
}

// On a shared API, List leaves out, unless asked for all, the claims that
// do not concern this node: never prepared here and allocated to no node
// or to another. Those allocated to this node (by a scheduler too),
// prepared here, or failed here are listed. On the node-local API every
// claim is.
func TestWhichClaimsConcernThisNode(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	r := &run{env: e, t: t, namespace: "default"}
	r.claim("never", "gpu")
	e.claimOfOther(t, "default", "elsewhere")
	if _, err := dratest.AllocatedClaim(ctx, e.api.Client, "default", "scheduled", gpu, "dev-31"); err != nil {
		t.Fatal(err)
	}
	r.claim("prepared", "gpu")
	r.prepare("p1", "prepared")
	r.claim("failed", "none")
	r.prepareFails("p2", "failed")

	local := claimview.New(e.api.Client, dratest.Node, e.mgr, e.reg)
	every := []string{"elsewhere", "failed", "never", "prepared", "scheduled"}
	for _, tc := range []struct {
		name string
		view *claimview.View
		all  bool
		want []string
	}{
		{"shared", e.view, false, []string{"failed", "prepared", "scheduled"}},
		{"shared, all", e.view, true, every},
		{"node-local", local, false, every},
		{"node-local, all", local, true, every},
	} {
		list, err := tc.view.List(ctx, claimview.ListOptions{All: tc.all})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range list {
			names = append(names, c.Name)
			if c.Name == "elsewhere" && c.AllocatedNode != other {
				t.Errorf("%s: claim elsewhere allocated to %q, want %s", tc.name, c.AllocatedNode, other)
			}
		}
		if !slices.Equal(names, tc.want) {
			t.Errorf("%s: listed %v, want %v", tc.name, names, tc.want)
		}
	}
}
