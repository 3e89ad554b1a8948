package podworker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimview"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/podworker"
	"github.com/nodeplug/nodeplug/services/internal/containers"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

const gpu = "gpu.example.com"

// env is a node: the node-local resource API (real), a DRA driver on the
// upstream helper with 4 devices (class "gpu"; class "none" selects no
// device), the registry, claimalloc, the claims manager over a journal,
// the view, and a pod worker over them.
type env struct {
	t      *testing.T
	root   string
	api    *dratest.API
	plugin *dratest.Plugin
	view   *claimview.View
	stop   func()
	// runtime runs the pods' containers when set (newEnvWith).
	runtime containers.Runtime
	// alloc follows DeviceTaintRules; the worker evicts by its taints.
	alloc *claimalloc.Allocator
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvWith(t, nil)
}

// newEnvWith is newEnv with a pod worker that runs the pods' containers
// with runtime.
func newEnvWith(t *testing.T, runtime containers.Runtime) *env {
	t.Helper()
	ctx := context.Background()
	root := testutil.TempDir(t)
	e := &env{t: t, root: root, api: dratest.StartAPI(t, root), plugin: dratest.NewPlugin(gpu), runtime: runtime}
	reg, err := drivers.New(drivers.Config{Client: e.api.Client, NodeName: dratest.Node, AllowedDirs: []string{root}})
	if err != nil {
		t.Fatal(err)
	}
	reg.Start()
	t.Cleanup(reg.Close)
	d := dratest.StartDriverWith(t, e.api, gpu, "", e.plugin)
	d.Publish(t, 4)
	dratest.WaitSlices(t, e.api.Client, gpu, 1, 4)
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
	res.FollowTaintRules()
	e.alloc = res
	mgr, err := claims.New(claims.Config{Reserver: res, Drivers: reg, Journal: j, RetryInitial: 10 * time.Millisecond,
		AllocatedHere: func(c *resourcev1.ResourceClaim) bool {
			return c.Annotations[claimalloc.AllocatedByAnnotation] == dratest.Node
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		mgr.Close()
		if err := j.Flush(); err != nil {
			t.Error(err)
		}
	})
	e.view = claimview.New(e.api.Client, dratest.Node, mgr, reg, claimview.SharedAPI(false))
	e.start()
	return e
}

// start runs a pod worker until stop (or the test's end).
func (e *env) start() {
	e.t.Helper()
	w, err := podworker.New(podworker.Config{Client: e.api.Client, Node: dratest.Node, Claims: e.view,
		StateFile: filepath.Join(e.root, "dra-manager", "pods.json"), RetryInitial: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond,
		Runtime: e.runtime, RootDir: e.root, Taints: e.alloc, EvictionInterval: 20 * time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	e.stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("pod worker: %v", err)
		}
	}
	e.t.Cleanup(e.stop)
}

func (e *env) create(objs ...any) {
	e.t.Helper()
	ctx := context.Background()
	c := e.api.Client
	for _, o := range objs {
		var err error
		switch o := o.(type) {
		case *corev1.Namespace:
			_, err = c.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = c.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *resourcev1.ResourceClaimTemplate:
			_, err = c.ResourceV1().ResourceClaimTemplates(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *resourcev1.ResourceClaim:
			_, err = c.ResourceV1().ResourceClaims(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			e.t.Fatalf("cannot create %T", o)
		}
		if err != nil {
			e.t.Fatal(err)
		}
	}
}

func spec(class string) resourcev1.ResourceClaimSpec {
	return resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
		Name: "r0", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: class}}}}}
}

func template(ns, name, class string) *resourcev1.ResourceClaimTemplate {
	return &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: resourcev1.ResourceClaimTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"made": "from-template"}}, Spec: spec(class)}}
}

// pod uses the template's claim ("own") in both containers and a shared
// claim in its init container.
func pod(ns, name, tpl, shared string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{
		ResourceClaims: []corev1.PodResourceClaim{{Name: "own", ResourceClaimTemplateName: &tpl}},
		Containers: []corev1.Container{{Name: "app", Image: "example.com/app:1",
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "own"}}}}},
	}}
	if shared != "" {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "shared", ResourceClaimName: &shared})
		p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: "example.com/init:1",
			Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "shared"}, {Name: "own"}}}}}
	}
	return p
}

func (e *env) pod(ns, name string) *corev1.Pod {
	e.t.Helper()
	p, err := e.api.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return p
}

func (e *env) claim(ns, name string) (*resourcev1.ResourceClaim, error) {
	return e.api.Client.ResourceV1().ResourceClaims(ns).Get(context.Background(), name, metav1.GetOptions{})
}

// events are the reasons of the pod's events, with their messages.
func (e *env) events(ns, name string) map[string]string {
	e.t.Helper()
	l, err := e.api.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.kind": "Pod", "involvedObject.name": name}.String()})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[string]string{}
	for _, ev := range l.Items {
		out[ev.Reason] = ev.Type + ": " + ev.Message
	}
	return out
}

func scheduled(p *corev1.Pod) *corev1.PodCondition {
	for i, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

// TestPodFromTemplates: a pod's template claim is made for it as the
// resourceclaim controller makes it, recorded in its status; its claims
// are allocated, reserved for it and prepared; it is bound to the node,
// with its conditions, container states and events. Deleting it
// releases its claims (unprepared), deletes the claim made for it and
// leaves the shared one.
func TestPodFromTemplates(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "demo"}},
		template("demo", "gpu-template", "gpu"),
		&resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "demo", Name: "shared"}, Spec: spec("gpu")})
	p := pod("demo", "trainer", "gpu-template", "shared")
	p.Spec.Containers[0].LivenessProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
	p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"example.com/fpga": resource.MustParse("1"), corev1.ResourceCPU: resource.MustParse("1")}
	e.create(p)

	var own string
	testutil.Eventually(t, "pod bound with its devices prepared", func() error {
		p := e.pod("demo", "trainer")
		if c := scheduled(p); p.Spec.NodeName != dratest.Node || c == nil || c.Status != corev1.ConditionTrue {
			return fmt.Errorf("node %q, scheduled %+v", p.Spec.NodeName, scheduled(p))
		}
		if len(p.Status.ResourceClaimStatuses) != 1 || p.Status.ResourceClaimStatuses[0].Name != "own" {
			return fmt.Errorf("resourceClaimStatuses %+v", p.Status.ResourceClaimStatuses)
		}
		own = *p.Status.ResourceClaimStatuses[0].ResourceClaimName
		return nil
	})
	p = e.pod("demo", "trainer")
	if !strings.HasPrefix(own, "trainer-own-") {
		t.Errorf("claim made from the template is %q, want trainer-own-<suffix>", own)
	}
	if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil ||
		p.Status.ContainerStatuses[0].State.Waiting.Reason != podworker.ReasonNoContainerRuntime || len(p.Status.InitContainerStatuses) != 1 {
		t.Errorf("container statuses %+v %+v", p.Status.ContainerStatuses, p.Status.InitContainerStatuses)
	}
	c, err := e.claim("demo", own)
	if err != nil {
		t.Fatal(err)
	}
	if c.Annotations[podworker.PodClaimNameAnnotation] != "own" || c.Labels["made"] != "from-template" ||
		len(c.OwnerReferences) != 1 || c.OwnerReferences[0].UID != p.UID || !ptr.Deref(c.OwnerReferences[0].Controller, false) {
		t.Errorf("claim from the template: %+v", c.ObjectMeta)
	}
	for _, name := range []string{own, "shared"} {
		c, err := e.claim("demo", name)
		if err != nil {
			t.Fatal(err)
		}
		if c.Status.Allocation == nil || len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].UID != p.UID {
			t.Errorf("claim %s: allocation %v, reserved for %+v", name, c.Status.Allocation != nil, c.Status.ReservedFor)
		}
		if prepared, _ := e.plugin.Calls(c.UID); prepared == 0 {
			t.Errorf("claim %s was not prepared by its driver", name)
		}
	}
	var ev map[string]string
	testutil.Eventually(t, "events recorded", func() error {
		ev = e.events("demo", "trainer")
		for _, r := range []string{podworker.ReasonScheduled, podworker.ReasonPrepared, podworker.ReasonUnsupportedField} {
			if ev[r] == "" {
				return fmt.Errorf("no %s event in %v", r, ev)
			}
		}
		return nil
	})
	if w := ev[podworker.ReasonUnsupportedField]; !strings.HasPrefix(w, "Warning") || !strings.Contains(w, "spec.containers[0].livenessProbe") ||
		!strings.Contains(w, "spec.containers[0].resources.limits[example.com/fpga]") || strings.Contains(w, "limits[cpu]") {
		t.Errorf("unsupported-field event: %s", w)
	}
	if m := ev[podworker.ReasonPrepared]; !strings.Contains(m, "app: ") || !strings.Contains(m, "init: ") {
		t.Errorf("prepared event does not name each container's CDI devices: %s", m)
	}

	ownClaim, _ := e.claim("demo", own)
	shared, _ := e.claim("demo", "shared")
	if err := e.api.Client.CoreV1().Pods("demo").Delete(ctx, "trainer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "pod released", func() error {
		if _, err := e.claim("demo", own); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim made for the pod: %v", err)
		}
		// Deleted only once unprepared: before, its device would look
		// free while the driver still holds it prepared.
		if _, unprepared := e.plugin.Calls(ownClaim.UID); unprepared == 0 {
			t.Fatalf("claim %s deleted before its driver unprepared it", own)
		}
		c, err := e.claim("demo", "shared")
		if err != nil {
			return err
		}
		if len(c.Status.ReservedFor) != 0 {
			return fmt.Errorf("shared claim still reserved for %+v", c.Status.ReservedFor)
		}
		for _, c := range []*resourcev1.ResourceClaim{ownClaim, shared} {
			if _, unprepared := e.plugin.Calls(c.UID); unprepared == 0 {
				return fmt.Errorf("claim %s not unprepared", c.Name)
			}
		}
		return nil
	})
}

// TestPodThatCannotBeSatisfied stays Pending and unbound, its
// PodScheduled condition False with the allocator's reason, and warning
// events; a pod whose template is missing gets an event naming it;
// deleting the pod deletes the claim made for it.
func TestPodThatCannotBeSatisfied(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.create(template("default", "nothing", "none"), pod("default", "stuck", "nothing", ""))
	testutil.Eventually(t, "pod unschedulable", func() error {
		p := e.pod("default", "stuck")
		c := scheduled(p)
		if c == nil || c.Status != corev1.ConditionFalse || c.Reason != corev1.PodReasonUnschedulable {
			return fmt.Errorf("scheduled %+v", c)
		}
		if !strings.Contains(c.Message, "cannot be allocated") {
			return fmt.Errorf("condition message %q does not give the allocator's reason", c.Message)
		}
		ev := e.events("default", "stuck")
		if !strings.HasPrefix(ev[podworker.ReasonFailedScheduling], "Warning") || ev[podworker.ReasonFailedPrepare] == "" {
			return fmt.Errorf("events %v", ev)
		}
		return nil
	})
	p := e.pod("default", "stuck")
	if p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		t.Fatalf("unsatisfiable pod: phase %s node %q", p.Status.Phase, p.Spec.NodeName)
	}
	// A pod whose template is missing says so.
	e.create(pod("default", "orphan", "no-such-template", ""))
	testutil.Eventually(t, "missing template reported", func() error {
		if ev := e.events("default", "orphan"); !strings.Contains(ev[podworker.ReasonFailedClaimCreation], "no-such-template") {
			return fmt.Errorf("events %v", ev)
		}
		return nil
	})
	own := *p.Status.ResourceClaimStatuses[0].ResourceClaimName
	if err := e.api.Client.CoreV1().Pods("default").Delete(ctx, "stuck", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "claim of the deleted pod gone", func() error {
		if _, err := e.claim("default", own); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: %v", own, err)
		}
		return nil
	})
}

// TestPodDeletedWhileTheWorkerWasDown is released at the worker's next
// start: its claims unprepared, the claim made for it deleted.
func TestPodDeletedWhileTheWorkerWasDown(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.create(template("default", "gpu-template", "gpu"), pod("default", "p", "gpu-template", ""))
	var own string
	testutil.Eventually(t, "pod prepared", func() error {
		p := e.pod("default", "p")
		if c := scheduled(p); c == nil || c.Status != corev1.ConditionTrue {
			return errors.New("not scheduled")
		}
		own = *p.Status.ResourceClaimStatuses[0].ResourceClaimName
		return nil
	})
	c, err := e.claim("default", own)
	if err != nil {
		t.Fatal(err)
	}
	e.stop()
	if err := e.api.Client.CoreV1().Pods("default").Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.claim("default", own); err != nil {
		t.Fatalf("the claim went with nothing to delete it: %v", err)
	}
	e.start()
	testutil.Eventually(t, "pod released at start", func() error {
		if _, err := e.claim("default", own); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: %v", own, err)
		}
		if _, unprepared := e.plugin.Calls(c.UID); unprepared == 0 {
			return errors.New("claim not unprepared")
		}
		return nil
	})
}
