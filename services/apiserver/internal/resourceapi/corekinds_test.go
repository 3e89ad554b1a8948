package resourceapi

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

func testPod(ns, name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": "demo"}},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{
				{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-template")},
				{Name: "shared", ResourceClaimName: ptr.To("shared-claim")},
			},
			InitContainers: []corev1.Container{{
				Name: "init", Image: "example.com/init:1.0",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "shared"}}},
			}},
			Containers: []corev1.Container{{
				Name: "app", Image: "example.com/app", Command: []string{"sh", "-c", "env"},
				Resources: corev1.ResourceRequirements{
					Claims: []corev1.ResourceClaim{{Name: "gpu", Request: "r0"}, {Name: "shared"}},
				},
			}},
			Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists}},
		},
	}
}

func testTemplate(ns, name string) *resourcev1.ResourceClaimTemplate {
	return &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: resourcev1.ResourceClaimTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"from": "template"}},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
				Name: "r0", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"},
			}}}},
		},
	}
}

func createNS(t *testing.T, c kubernetes.Interface, name string, labels map[string]string) *corev1.Namespace {
	t.Helper()
	ns, err := c.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return ns
}

// TestDiscoveryListsEveryKind: /api/v1 and /apis/resource.k8s.io/v1 list
// the kinds served, with their status subresources and short names.
func TestDiscoveryListsEveryKind(t *testing.T) {
	a := startAPI(t, Limits{})
	c := a.client("reader", RoleReader)
	want := map[string][]string{
		"v1":                 {"namespaces", "namespaces/status", "nodes", "pods", "pods/status", "events"},
		"resource.k8s.io/v1": {"resourceslices", "resourceclaims", "resourceclaims/status", "deviceclasses", "resourceclaimtemplates", "devicetaintrules", "devicetaintrules/status"},
	}
	for gv, names := range want {
		l, err := c.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil {
			t.Fatalf("%s: %v", gv, err)
		}
		var got []string
		for _, r := range l.APIResources {
			got = append(got, r.Name)
			if r.Name == "pods" && !slices.Equal(r.ShortNames, []string{"po"}) {
				t.Errorf("pods short names %v", r.ShortNames)
			}
			if r.Name == "namespaces" && slices.Contains(r.Verbs, "deletecollection") {
				t.Errorf("namespaces list deletecollection: %v", r.Verbs)
			}
		}
		slices.Sort(got)
		slices.Sort(names)
		if !slices.Equal(got, names) {
			t.Errorf("%s lists %v, want %v", gv, got, names)
		}
	}
}

// TestNamespaceLifecycle: the namespaces of a new cluster exist; an
// object is created only in a namespace that exists; deleting a namespace
// deletes what is in it (each a Deleted watch event), then the namespace;
// default may not be deleted; namespaces have no deletecollection.
func TestNamespaceLifecycle(t *testing.T) {
	a := startAPI(t, Limits{})
	op := a.client("op", RoleOperator)
	ctx := context.Background()
	for _, name := range []string{"default", "kube-system", "kube-public", "kube-node-lease"} {
		ns, err := op.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil || ns.Status.Phase != corev1.NamespaceActive || ns.Labels[corev1.LabelMetadataName] != name {
			t.Fatalf("namespace %s: %+v %v", name, ns, err)
		}
	}
	_, err := op.CoreV1().Pods("demo").Create(ctx, testPod("demo", "p"), metav1.CreateOptions{})
	if !apierrors.IsNotFound(err) || !strings.Contains(err.Error(), `namespaces "demo" not found`) {
		t.Fatalf("pod in a missing namespace: %v, want 404 naming the namespace", err)
	}
	if _, err := op.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "Not_A_Label"}}, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("invalid namespace name: %v, want 422", err)
	}
	ns := createNS(t, op, "demo", nil)
	if ns.Status.Phase != corev1.NamespaceActive || !slices.Equal(ns.Spec.Finalizers, []corev1.FinalizerName{corev1.FinalizerKubernetes}) {
		t.Fatalf("new namespace: %+v", ns)
	}
	if _, err := op.CoreV1().Pods("demo").Create(ctx, testPod("demo", "p"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := op.ResourceV1().ResourceClaimTemplates("demo").Create(ctx, testTemplate("demo", "gpu-template"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "p.1", Namespace: "demo"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "demo", Name: "p"}, Reason: "Scheduled", Type: corev1.EventTypeNormal}
	if _, err := op.CoreV1().Events("demo").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Objects of the same names elsewhere stay.
	if _, err := op.CoreV1().Pods("default").Create(ctx, testPod("default", "p"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w, err := a.watchClient("w", RoleReader).CoreV1().Pods("").Watch(ctx, metav1.ListOptions{ResourceVersion: "0"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	for range 2 {
		if e := next(t, w); e.Type != watch.Added {
			t.Fatalf("initial event %v", e.Type)
		}
	}

	if err := op.CoreV1().Namespaces().Delete(ctx, "default", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("delete default: %v, want 403", err)
	}
	if err := op.CoreV1().Namespaces().Delete(ctx, "demo", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if e := next(t, w); e.Type != watch.Deleted || e.Object.(*corev1.Pod).Namespace != "demo" {
		t.Fatalf("watch after the namespace's deletion: %v %v", e.Type, e.Object)
	}
	if _, err := op.CoreV1().Namespaces().Get(ctx, "demo", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("namespace after delete: %v", err)
	}
	for what, err := range map[string]error{
		"pod":      getErr(op.CoreV1().Pods("demo").Get(ctx, "p", metav1.GetOptions{})),
		"template": getErr(op.ResourceV1().ResourceClaimTemplates("demo").Get(ctx, "gpu-template", metav1.GetOptions{})),
		"event":    getErr(op.CoreV1().Events("demo").Get(ctx, "p.1", metav1.GetOptions{})),
	} {
		if !apierrors.IsNotFound(err) {
			t.Errorf("%s after its namespace's deletion: %v", what, err)
		}
	}
	if _, err := op.CoreV1().Pods("default").Get(ctx, "p", metav1.GetOptions{}); err != nil {
		t.Fatalf("pod of another namespace: %v", err)
	}
	if _, err := op.CoreV1().Pods("demo").Create(ctx, testPod("demo", "p"), metav1.CreateOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("pod in the deleted namespace: %v", err)
	}
	rc := op.CoreV1().RESTClient()
	if err := rc.Delete().AbsPath("/api/v1/namespaces").Do(ctx).Error(); !apierrors.IsMethodNotSupported(err) {
		t.Fatalf("deletecollection of namespaces: %v, want 405", err)
	}
}

func getErr[T any](_ T, err error) error { return err }

// TestNamespaceDeletionFinishesAfterRestart: a namespace left Terminating
// (a crash in the middle of its deletion) is finished when the API starts.
func TestNamespaceDeletionFinishesAfterRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "api.db")
	_, st := openTestServer(t, path, Limits{})
	now := metav1.Now()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "gone", UID: "u", DeletionTimestamp: &now},
		Status: corev1.NamespaceStatus{Phase: corev1.NamespaceTerminating}}
	for k, obj := range map[*kind]runtime.Object{kindNamespace: ns, kindPod: testPod("gone", "p")} {
		if _, err := st.mutate(k, objectKey(obj), func(runtime.Object) (runtime.Object, error) { return obj, nil }); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	_, st = openTestServer(t, path, Limits{})
	defer func() { _ = st.Close() }()
	if st.get(kindNamespace, "gone") != nil || st.get(kindPod, "gone/p") != nil {
		t.Fatal("the terminating namespace or its pod is still there after a restart")
	}
	if st.get(kindNamespace, "default") == nil {
		t.Fatal("default namespace missing")
	}
}

// TestPodDefaultsStatusAndUpdates: a Pod is defaulted as kube-apiserver
// defaults it and starts Pending whatever status it was sent with; a
// status write changes only the status, a write of the pod only what a
// pod may change; invalid pods are 422 with the field named; every field
// sent is kept.
func TestPodDefaultsStatusAndUpdates(t *testing.T) {
	a := startAPI(t, Limits{})
	op := a.client("op", RoleOperator)
	internal := a.client("dm", RoleInternal)
	ctx := context.Background()
	in := testPod("default", "p")
	in.Status.Phase = corev1.PodRunning
	p, err := op.CoreV1().Pods("default").Create(ctx, in, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending || p.Spec.RestartPolicy != corev1.RestartPolicyAlways ||
		p.Spec.SchedulerName != corev1.DefaultSchedulerName || *p.Spec.TerminationGracePeriodSeconds != 30 ||
		p.Spec.Containers[0].ImagePullPolicy != corev1.PullAlways || p.Spec.InitContainers[0].ImagePullPolicy != corev1.PullIfNotPresent ||
		p.Spec.Containers[0].TerminationMessagePath != corev1.TerminationMessagePathDefault {
		t.Fatalf("defaults or status not set: %+v", p)
	}
	if !slices.Equal(p.Spec.Containers[0].Command, in.Spec.Containers[0].Command) || len(p.Spec.ResourceClaims) != 2 ||
		*p.Spec.ResourceClaims[0].ResourceClaimTemplateName != "gpu-template" || p.Spec.Containers[0].Resources.Claims[0].Request != "r0" ||
		len(p.Spec.Tolerations) != 1 {
		t.Fatalf("fields dropped: %+v", p.Spec)
	}

	st := p.DeepCopy()
	st.Status.Phase = corev1.PodRunning
	st.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "app", Ready: true}}
	st.Spec.Containers[0].Image = "ignored/by-a-status-write"
	p2, err := internal.CoreV1().Pods("default").UpdateStatus(ctx, st, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p2.Status.Phase != corev1.PodRunning || p2.Spec.Containers[0].Image != "example.com/app" {
		t.Fatalf("status write: %+v", p2)
	}

	up := p2.DeepCopy()
	up.Spec.Containers[0].Image = "example.com/app:2"
	up.Status.Phase = corev1.PodFailed
	p3, err := op.CoreV1().Pods("default").Update(ctx, up, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("image change: %v", err)
	}
	if p3.Status.Phase != corev1.PodRunning || p3.Spec.Containers[0].Image != "example.com/app:2" {
		t.Fatalf("update: %+v", p3)
	}
	bad := p3.DeepCopy()
	bad.Spec.Containers[0].Command = []string{"other"}
	if _, err := op.CoreV1().Pods("default").Update(ctx, bad, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), "pod updates may not change fields") {
		t.Fatalf("command change: %v, want 422", err)
	}

	for name, mutate := range map[string]func(*corev1.Pod){
		"spec.containers":          func(p *corev1.Pod) { p.Spec.Containers = nil },
		"spec.containers[0].image": func(p *corev1.Pod) { p.Spec.Containers[0].Image = "" },
		"spec.containers[0].name":  func(p *corev1.Pod) { p.Spec.InitContainers[0].Name = "app" },
		"spec.containers[0].resources.claims[0].name": func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Claims[0].Name = "nope"
		},
		"spec.resourceClaims[1]":   func(p *corev1.Pod) { p.Spec.ResourceClaims[1].ResourceClaimTemplateName = ptr.To("t") },
		"spec.restartPolicy":       func(p *corev1.Pod) { p.Spec.RestartPolicy = "Sometimes" },
		"spec.ephemeralContainers": func(p *corev1.Pod) { p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{}} },
	} {
		p := testPod("default", "bad")
		mutate(p)
		_, err := op.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want 422 naming it", name, err)
		}
	}
	// A driver may not write pods.
	if _, err := a.client("drv", RoleDriver).CoreV1().Pods("default").Create(ctx, testPod("default", "x"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("driver creates a pod: %v, want 403", err)
	}
}

// TestClaimTemplatesAndTaintRules: templates are defaulted and validated
// as claims are, and immutable; taint rules are validated.
func TestClaimTemplatesAndTaintRules(t *testing.T) {
	a := startAPI(t, Limits{})
	op := a.client("op", RoleOperator)
	ctx := context.Background()
	tpl, err := op.ResourceV1().ResourceClaimTemplates("default").Create(ctx, testTemplate("default", "t"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if e := tpl.Spec.Spec.Devices.Requests[0].Exactly; e.AllocationMode != resourcev1.DeviceAllocationModeExactCount || e.Count != 1 ||
		tpl.Spec.Labels["from"] != "template" {
		t.Fatalf("template: %+v", tpl.Spec)
	}
	tpl.Spec.Spec.Devices.Requests[0].Exactly.Count = 2
	if _, err := op.ResourceV1().ResourceClaimTemplates("default").Update(ctx, tpl, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("template spec change: %v, want 422", err)
	}
	bad := testTemplate("default", "bad")
	bad.Spec.Spec.Devices.Requests[0].Exactly.DeviceClassName = ""
	if _, err := op.ResourceV1().ResourceClaimTemplates("default").Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), "spec.spec.devices.requests[0].exactly.deviceClassName") {
		t.Fatalf("template without a class: %v", err)
	}

	rule := &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "maintenance"}, Spec: resourcev1.DeviceTaintRuleSpec{
		DeviceSelector: &resourcev1.DeviceTaintSelector{Driver: ptr.To("gpu.example.com"), Device: ptr.To("gpu-0")},
		Taint:          resourcev1.DeviceTaint{Key: "example.com/maintenance", Value: "soon", Effect: resourcev1.DeviceTaintEffectNoSchedule},
	}}
	if _, err := op.ResourceV1().DeviceTaintRules().Create(ctx, rule, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*resourcev1.DeviceTaintRule){
		"spec.taint.key":    func(r *resourcev1.DeviceTaintRule) { r.Spec.Taint.Key = "" },
		"spec.taint.effect": func(r *resourcev1.DeviceTaintRule) { r.Spec.Taint.Effect = "Evict" },
		"spec.taint.value":  func(r *resourcev1.DeviceTaintRule) { r.Spec.Taint.Value = "not a value" },
	} {
		r := rule.DeepCopy()
		r.Name = "bad"
		mutate(r)
		if _, err := op.ResourceV1().DeviceTaintRules().Create(ctx, r, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want 422 naming it", name, err)
		}
	}
}

// TestEventsAreBounded: events beyond MaxEvents push out the oldest, an
// event older than the TTL goes at the next expiry, an oversized one is
// 413, and events are selected by the object they are about.
func TestEventsAreBounded(t *testing.T) {
	a := startAPI(t, Limits{MaxEvents: 3, EventTTL: time.Hour})
	op := a.client("op", RoleOperator)
	ctx := context.Background()
	base := time.Now().Add(-time.Minute)
	for i := range 5 {
		ev := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("e%d", i), Namespace: "default"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: fmt.Sprintf("p%d", i%2)},
			Reason:         "Started", LastTimestamp: metav1.NewTime(base.Add(time.Duration(i) * time.Second))}
		if _, err := op.CoreV1().Events("default").Create(ctx, ev, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	l, err := op.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range l.Items {
		names = append(names, e.Name)
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"e2", "e3", "e4"}) {
		t.Fatalf("events kept %v, want the newest three", names)
	}
	l, err = op.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.kind=Pod,involvedObject.name=p0"})
	if err != nil || len(l.Items) != 2 {
		t.Fatalf("events of p0: %v %v", l, err)
	}
	// Two hours on, every event is past the TTL.
	if n := a.srv.expireEvents(time.Now().Add(2 * time.Hour)); n != 3 {
		t.Fatalf("expired %d events two hours on, want the 3 left", n)
	}
	if n := a.st.count(kindEvent); n != 0 {
		t.Fatalf("%d events left", n)
	}
	big := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "default"}, Message: strings.Repeat("x", MaxEventBytes)}
	if _, err := op.CoreV1().Events("default").Create(ctx, big, metav1.CreateOptions{}); !apierrors.IsRequestEntityTooLargeError(err) {
		t.Fatalf("oversized event: %v, want 413", err)
	}
	bad := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: "default"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "other", Name: "p"}}
	if _, err := op.CoreV1().Events("default").Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("event about another namespace's object: %v, want 422", err)
	}
}

// TestAdminAccessNeedsTheNamespaceLabel: a claim or template asking for
// admin access is created only in a namespace labelled for it.
func TestAdminAccessNeedsTheNamespaceLabel(t *testing.T) {
	a := startAPI(t, Limits{})
	op := a.client("op", RoleOperator)
	ctx := context.Background()
	createNS(t, op, "admins", map[string]string{resourcev1.DRAAdminNamespaceLabelKey: "true"})
	admin := func(ns string) *resourcev1.ResourceClaimTemplate {
		tpl := testTemplate(ns, "admin")
		tpl.Spec.Spec.Devices.Requests[0].Exactly.AdminAccess = ptr.To(true)
		return tpl
	}
	_, err := op.ResourceV1().ResourceClaimTemplates("default").Create(ctx, admin("default"), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.spec.devices.requests[0].exactly.adminAccess") ||
		!strings.Contains(err.Error(), resourcev1.DRAAdminNamespaceLabelKey) {
		t.Fatalf("admin template in an unlabelled namespace: %v, want 422", err)
	}
	if _, err := op.ResourceV1().ResourceClaimTemplates("admins").Create(ctx, admin("admins"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("admin template in a labelled namespace: %v", err)
	}
	claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "default"}, Spec: admin("default").Spec.Spec}
	if _, err := op.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("admin claim in an unlabelled namespace: %v, want 422", err)
	}
	claim.Namespace = "admins"
	if _, err := op.ResourceV1().ResourceClaims("admins").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatalf("admin claim in a labelled namespace: %v", err)
	}
}
