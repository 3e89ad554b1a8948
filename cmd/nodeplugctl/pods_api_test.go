package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/apiserver/apiservertest"
)

// podFixture writes, as the dramanager's pod worker would, a pod of
// namespace ml whose template claim is made, allocated and reserved for
// it, with its status and events; and a pod of default that nothing ran.
// It returns the trainer pod as stored.
func podFixture(t *testing.T, cs kubernetes.Interface) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{})
	must(err)
	claimSpec := resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
		{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.example.com"}},
	}}}
	_, err = cs.ResourceV1().ResourceClaimTemplates("ml").Create(ctx, &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu-template"},
		Spec:       resourcev1.ResourceClaimTemplateSpec{Spec: claimSpec},
	}, metav1.CreateOptions{})
	must(err)
	tmpl := "gpu-template"
	pod, err := cs.CoreV1().Pods("ml").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Labels: map[string]string{"app": "trainer"}},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}},
			Containers: []corev1.Container{{Name: "main", Image: "example.com/trainer:1",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
		},
	}, metav1.CreateOptions{})
	must(err)
	_, err = cs.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx:1.29"}}},
	}, metav1.CreateOptions{})
	must(err)

	claim, err := cs.ResourceV1().ResourceClaims("ml").Create(ctx, &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer-gpu-x7k2p",
			Annotations:     map[string]string{"resource.kubernetes.io/pod-claim-name": "gpu"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "trainer", UID: pod.UID}}},
		Spec: claimSpec,
	}, metav1.CreateOptions{})
	must(err)
	claim.Status.Allocation = &resourcev1.AllocationResult{Devices: resourcev1.DeviceAllocationResult{Results: []resourcev1.DeviceRequestAllocationResult{
		{Request: "gpu", Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0"},
	}}}
	claim.Status.ReservedFor = []resourcev1.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer", UID: pod.UID}}
	_, err = cs.ResourceV1().ResourceClaims("ml").UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	must(err)

	pod.Spec.NodeName = "node-a"
	pod, err = cs.CoreV1().Pods("ml").Update(ctx, pod, metav1.UpdateOptions{})
	must(err)
	claimName := claim.Name
	pod.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: &claimName}}
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "main", Image: "example.com/trainer:1",
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "NoContainerRuntime", Message: "no container runtime runs containers on this node yet"}}}}
	pod, err = cs.CoreV1().Pods("ml").UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	must(err)
	return pod
}

// podEvent is an event on pod trainer of namespace ml (uid: its UID) that
// first occurred at first and last at last.
func podEvent(name, reason, message string, uid string, first, last time.Time, count int32) *corev1.Event {
	return &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: "ml"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: "ml", Name: "trainer", UID: types.UID(uid)},
		Reason:         reason, Message: message, Type: corev1.EventTypeNormal,
		Source:         corev1.EventSource{Component: "nodeplug-dramanager", Host: "node-a"},
		FirstTimestamp: metav1.NewTime(first), LastTimestamp: metav1.NewTime(last), Count: count,
	}
}

// TestPodsEventsAndDescribeAgainstTheNodeLocalAPI lists the pods, the
// events and describes a pod of a real node-local API, as tables and as
// the API's objects; a pod that is not there is an error naming it.
func TestPodsEventsAndDescribeAgainstTheNodeLocalAPI(t *testing.T) {
	root := testutil.TempDir(t)
	api := apiservertest.Start(t, root, "node-a")
	ctx := context.Background()
	pod := podFixture(t, api.Client)

	// The clock of the tables: 3m30s after the pods were created.
	at := pod.CreationTimestamp.Add(3*time.Minute + 30*time.Second)
	saved := now
	now = func() time.Time { return at }
	t.Cleanup(func() { now = saved })
	uid := string(pod.UID)
	for _, e := range []*corev1.Event{
		podEvent("trainer.1", "Scheduled", "Successfully assigned ml/trainer to node-a", uid, at.Add(-150*time.Second), at.Add(-150*time.Second), 1),
		podEvent("trainer.2", "PreparedDynamicResources", "the pod's claims are prepared;\nCDI devices main: gpu.example.com/gpu=gpu-0", uid,
			at.Add(-125*time.Second), at.Add(-65*time.Second), 2),
		// The latest, of an earlier pod of the same name.
		podEvent("trainer.0", "Killing", "Stopping container main", "0e5c1b7a-0000-4000-8000-000000000000", at.Add(-10*time.Second), at.Add(-10*time.Second), 1),
	} {
		if _, err := api.Client.CoreV1().Events("ml").Create(ctx, e, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	check := func(what string, args []string, want string) {
		t.Helper()
		code, out, errOut := runCLI(t, append([]string{"--root-dir", root}, args...)...)
		if code != exitOK || out != want {
			t.Errorf("%s: exit %d:\n%s%s\nwant:\n%s", what, code, out, errOut, want)
		}
	}
	check("pods", []string{"pods"},
		"NAMESPACE  NAME     PHASE    READY                   CLAIMS                 DEVICES                       AGE  LAST EVENT\n"+
			"default    web      Pending  0/1                     -                      -                             3m\n"+
			"ml         trainer  Pending  0/1 NoContainerRuntime  gpu=trainer-gpu-x7k2p  gpu.example.com/node-a/gpu-0  3m   PreparedDynamicResources\n")
	// The reader's kubeconfig reads too.
	check("pods -n ml (reader)", []string{"pods", "-n", "ml", "--kubeconfig", layout.IdentityKubeconfigFile(root, "reader")},
		"NAMESPACE  NAME     PHASE    READY                   CLAIMS                 DEVICES                       AGE  LAST EVENT\n"+
			"ml         trainer  Pending  0/1 NoContainerRuntime  gpu=trainer-gpu-x7k2p  gpu.example.com/node-a/gpu-0  3m   PreparedDynamicResources\n")
	check("pods -n kube-system", []string{"pods", "-n", "kube-system"}, "no pods in namespace kube-system\n")
	check("events --for", []string{"events", "--for", "ml/trainer"},
		"LAST SEEN        TYPE    REASON                    OBJECT       MESSAGE\n"+
			"2m               Normal  Scheduled                 pod/trainer  Successfully assigned ml/trainer to node-a\n"+
			"1m (x2 over 2m)  Normal  PreparedDynamicResources  pod/trainer  the pod's claims are prepared; CDI devices main: gpu.example.com/gpu=gpu-0\n"+
			"10s              Normal  Killing                   pod/trainer  Stopping container main\n")
	check("events", []string{"events"},
		"NAMESPACE  LAST SEEN        TYPE    REASON                    OBJECT       MESSAGE\n"+
			"ml         2m               Normal  Scheduled                 pod/trainer  Successfully assigned ml/trainer to node-a\n"+
			"ml         1m (x2 over 2m)  Normal  PreparedDynamicResources  pod/trainer  the pod's claims are prepared; CDI devices main: gpu.example.com/gpu=gpu-0\n"+
			"ml         10s              Normal  Killing                   pod/trainer  Stopping container main\n")
	check("events --for NAME -n", []string{"events", "--for", "web", "-n", "default"}, "no events of pod default/web\n")
	describe := "Name:       trainer\n" +
		"Namespace:  ml\n" +
		"Node:       node-a\n" +
		"Labels:     app=trainer\n" +
		"Status:     Pending\n" +
		"Conditions:\n" +
		"  Type          Status  Reason  Message\n" +
		"  PodScheduled  True\n" +
		"Containers:\n" +
		"  main:\n" +
		"    Image:      example.com/trainer:1\n" +
		"    State:      Waiting\n" +
		"      Reason:   NoContainerRuntime\n" +
		"      Message:  no container runtime runs containers on this node yet\n" +
		"    Ready:      False\n" +
		"    Claims:     gpu (trainer-gpu-x7k2p)\n" +
		"Resource Claims:\n" +
		"  gpu:\n" +
		"    Claim:         trainer-gpu-x7k2p (from template gpu-template)\n" +
		"    Allocated:     yes\n" +
		"    Devices:       gpu.example.com/node-a/gpu-0\n" +
		"    Reserved For:  pod/trainer\n" +
		"Events:\n" +
		"  LAST SEEN        TYPE    REASON                    OBJECT       MESSAGE\n" +
		"  2m               Normal  Scheduled                 pod/trainer  Successfully assigned ml/trainer to node-a\n" +
		"  1m (x2 over 2m)  Normal  PreparedDynamicResources  pod/trainer  the pod's claims are prepared; CDI devices main: gpu.example.com/gpu=gpu-0\n"
	check("describe pod NS/NAME", []string{"describe", "pod", "ml/trainer"}, describe)
	check("describe pod NAME -n", []string{"describe", "-n", "ml", "pod", "trainer"}, describe)
	check("describe po/NAME -n", []string{"describe", "po/trainer", "--namespace", "ml"}, describe)
	check("describe pod web", []string{"describe", "pod", "web"},
		"Name:        web\n"+
			"Namespace:   default\n"+
			"Node:        <none>\n"+
			"Labels:      <none>\n"+
			"Status:      Pending\n"+
			"Conditions:  <none>\n"+
			"Containers:\n"+
			"  nginx:\n"+
			"    Image:        nginx:1.29\n"+
			"    State:        <none>\n"+
			"    Claims:       <none>\n"+
			"Resource Claims:  <none>\n"+
			"Events:           <none>\n")

	// -o json and -o yaml: the API's objects, as lists of their kind.
	code, out, errOut := runCLI(t, "--root-dir", root, "pods", "-o", "json")
	var pods corev1.PodList
	if err := json.Unmarshal([]byte(out), &pods); code != exitOK || err != nil || pods.Kind != "PodList" || pods.APIVersion != "v1" || len(pods.Items) != 2 ||
		pods.Items[1].Name != "trainer" || pods.Items[1].UID != pod.UID || pods.Items[1].Status.ContainerStatuses[0].State.Waiting.Reason != "NoContainerRuntime" {
		t.Errorf("pods -o json: exit %d, %v:\n%s%s", code, err, out, errOut)
	}
	code, out, errOut = runCLI(t, "--root-dir", root, "-o", "yaml", "pods", "-A")
	pods = corev1.PodList{}
	if err := sigsyaml.UnmarshalStrict([]byte(out), &pods); code != exitOK || err != nil || pods.Kind != "PodList" || len(pods.Items) != 2 {
		t.Errorf("-o yaml pods -A: exit %d, %v:\n%s%s", code, err, out, errOut)
	}
	code, out, errOut = runCLI(t, "--root-dir", root, "events", "--for", "ml/trainer", "-o", "json")
	var events corev1.EventList
	if err := json.Unmarshal([]byte(out), &events); code != exitOK || err != nil || events.Kind != "EventList" || events.APIVersion != "v1" || len(events.Items) != 3 ||
		events.Items[0].Reason != "Scheduled" || events.Items[2].Reason != "Killing" {
		t.Errorf("events --for -o json: exit %d, %v:\n%s%s", code, err, out, errOut)
	}
	for _, format := range []string{"json", "yaml"} {
		code, out, errOut = runCLI(t, "--root-dir", root, "describe", "pod", "ml/trainer", "-o", format)
		var got corev1.Pod
		if err := sigsyaml.UnmarshalStrict([]byte(out), &got); code != exitOK || err != nil || got.Kind != "Pod" || got.APIVersion != "v1" ||
			got.UID != pod.UID || got.ResourceVersion != pod.ResourceVersion || *got.Status.ResourceClaimStatuses[0].ResourceClaimName != "trainer-gpu-x7k2p" {
			t.Errorf("describe pod -o %s: exit %d, %v:\n%s%s", format, code, err, out, errOut)
		}
	}

	// A pod that is not there.
	for _, args := range [][]string{{"describe", "pod", "ml/nope"}, {"describe", "pod", "nope", "-n", "ml"}, {"-o", "json", "describe", "pod", "ml/nope"}} {
		code, out, errOut = runCLI(t, append([]string{"--root-dir", root}, args...)...)
		if code != exitError || out != "" || errOut != "nodeplugctl describe: pod ml/nope not found (nodeplugctl pods lists the pods)\n" {
			t.Errorf("%q: exit %d: %s%s", args, code, out, errOut)
		}
	}
}

// TestPodsCommandLines: the mistakes on the command lines of pods, events
// and describe are usage errors, before any API is asked.
func TestPodsCommandLines(t *testing.T) {
	root := testutil.TempDir(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"pods", "-n", "ml", "-A"}, "-n ml and -A: give one"},
		{[]string{"pods", "extra"}, `unexpected arguments ["extra"]`},
		{[]string{"pods", "-o", "text"}, `output format "text": want table or json or yaml`},
		{[]string{"events", "--for", "ml/trainer", "-n", "other"}, "pod ml/trainer is in namespace ml, not --namespace other"},
		{[]string{"events", "--for", "ml/"}, `"ml/": want NAME or NAMESPACE/NAME`},
		{[]string{"describe"}, "name the pod: describe pod NS/NAME"},
		{[]string{"describe", "pod"}, "name the pod: describe pod NS/NAME"},
		{[]string{"describe", "deviceclass", "gpu"}, `describe takes pods (pod, pods, po), not "deviceclass"`},
		{[]string{"describe", "pod", "a", "b"}, `describe one pod at a time: unexpected arguments ["b"]`},
		{[]string{"describe", "pod", "ml/trainer", "-n", "other"}, "pod ml/trainer is in namespace ml, not --namespace other"},
		{[]string{"describe", "pod/ml/trainer"}, `"pod/ml/trainer": want pod/NAME`},
		{[]string{"describe", "pod", "ml/trainer", "-o", "table"}, `output format "table": want text or json or yaml`},
	} {
		code, out, errOut := runCLI(t, append([]string{"--root-dir", root}, tc.args...)...)
		if code != exitUsage || out != "" || !strings.Contains(errOut, tc.want) || !strings.Contains(errOut, "usage: nodeplugctl "+tc.args[0]) {
			t.Errorf("%q: exit %d: %s%s, want usage error %q", tc.args, code, out, errOut, tc.want)
		}
	}
	// No API under the root dir: the kubeconfig it looked for is named.
	code, _, errOut := runCLI(t, "--root-dir", root, "pods")
	if code != exitError || !strings.Contains(errOut, layout.IdentityKubeconfigFile(root, "operator")) {
		t.Errorf("pods without an API: exit %d: %s", code, errOut)
	}
}

// TestSince: ages as kubectl's AGE column writes them, in whole units.
func TestSince(t *testing.T) {
	base := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		ago  time.Duration
		want string
	}{
		{0, "0s"},
		{-30 * time.Second, "0s"}, // another clock, ahead
		{999 * time.Millisecond, "0s"},
		{5 * time.Second, "5s"},
		{59*time.Second + 900*time.Millisecond, "59s"},
		{time.Minute, "1m"},
		{3*time.Minute + 59*time.Second, "3m"},
		{59 * time.Minute, "59m"},
		{time.Hour, "1h"},
		{2*time.Hour + 30*time.Minute, "2h"},
		{23*time.Hour + 59*time.Minute, "23h"},
		{24 * time.Hour, "1d"},
		{4*24*time.Hour + 23*time.Hour, "4d"},
		{364 * 24 * time.Hour, "364d"},
		{365 * 24 * time.Hour, "1y"},
		{3 * 365 * 24 * time.Hour, "3y"},
	} {
		if got := since(base, base.Add(-tc.ago)); got != tc.want {
			t.Errorf("since %v ago: %q, want %q", tc.ago, got, tc.want)
		}
	}
	if got := since(base, time.Time{}); got != "-" {
		t.Errorf("since an unset time: %q, want -", got)
	}
}

// TestContainerSummary: ready of all, then the states' reasons, each
// once.
func TestContainerSummary(t *testing.T) {
	waiting := func(name, reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
	}
	pod := func(n int, init []corev1.ContainerStatus, st ...corev1.ContainerStatus) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: st, InitContainerStatuses: init}}
		p.Spec.Containers = make([]corev1.Container, n)
		return p
	}
	running := corev1.ContainerStatus{Name: "b", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	for _, tc := range []struct {
		pod  *corev1.Pod
		want string
	}{
		{pod(1, nil), "0/1"},
		{pod(2, nil, waiting("a", "NoContainerRuntime"), waiting("b", "NoContainerRuntime")), "0/2 NoContainerRuntime"},
		{pod(2, nil, waiting("a", ""), running), "1/2 Waiting,Running"},
		{pod(1, []corev1.ContainerStatus{waiting("i", "NoContainerRuntime")}, waiting("a", "NoContainerRuntime")), "0/1 Init:NoContainerRuntime,NoContainerRuntime"},
		{pod(1, nil, corev1.ContainerStatus{Name: "a", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}}), "0/1 Completed"},
	} {
		if got := containerSummary(tc.pod); got != tc.want {
			t.Errorf("containerSummary of %+v: %q, want %q", tc.pod.Status, got, tc.want)
		}
	}
}

// TestCompleteDescribe: describe completes the kind it takes, once.
func TestCompleteDescribe(t *testing.T) {
	if got := completions(t, "describe"); !slices.Contains(got, "pod") || !slices.Contains(got, "--namespace") {
		t.Errorf("describe's completions: %v, want pod and its flags", got)
	}
	if got := completions(t, "describe", "pod"); slices.Contains(got, "pod") {
		t.Errorf("after describe pod: %v, want no kind", got)
	}
	for _, cmd := range []string{"pods", "events"} {
		if got := completions(t, cmd); !slices.Contains(got, "--kubeconfig") || slices.Contains(got, "pod") {
			t.Errorf("%s's completions: %v", cmd, got)
		}
	}
}

// TestDescribeUnschedulablePod: a pod whose claim could not be allocated
// shows why in its PodScheduled condition; a template claim not made
// yet, and a named one the API does not have, say so.
func TestDescribeUnschedulablePod(t *testing.T) {
	tmpl, named := "gpu-template", "shared-gpu"
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "ml"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: &tmpl}, {Name: "shared", ResourceClaimName: &named}},
			Containers: []corev1.Container{{Name: "main", Image: "app",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}, {Name: "shared", Request: "one"}}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
			Reason: corev1.PodReasonUnschedulable, Message: "cannot allocate all claims:\nno device of class gpu.example.com is free"}}},
	}
	e := *podEvent("trainer.1", "FailedScheduling", "cannot allocate all claims", "", testNow.Add(-4*24*time.Hour), testNow.Add(-2*time.Hour), 7)
	e.Type = corev1.EventTypeWarning
	var b strings.Builder
	if err := renderPodDescription(&b, testNow, p, map[string]*resourcev1.ResourceClaim{}, []corev1.Event{e}); err != nil {
		t.Fatal(err)
	}
	want := "Name:       trainer\n" +
		"Namespace:  ml\n" +
		"Node:       <none>\n" +
		"Labels:     <none>\n" +
		"Status:     Pending\n" +
		"Conditions:\n" +
		"  Type          Status  Reason         Message\n" +
		"  PodScheduled  False   Unschedulable  cannot allocate all claims: no device of class gpu.example.com is free\n" +
		"Containers:\n" +
		"  main:\n" +
		"    Image:   app\n" +
		"    State:   <none>\n" +
		"    Claims:  gpu, shared/one (shared-gpu)\n" +
		"Resource Claims:\n" +
		"  gpu:\n" +
		"    Claim:      <not made yet> (from template gpu-template)\n" +
		"    Allocated:  no\n" +
		"  shared:\n" +
		"    Claim:      shared-gpu (not found)\n" +
		"    Allocated:  no\n" +
		"Events:\n" +
		"  LAST SEEN        TYPE     REASON            OBJECT       MESSAGE\n" +
		"  2h (x7 over 4d)  Warning  FailedScheduling  pod/trainer  cannot allocate all claims\n"
	if b.String() != want {
		t.Errorf("described:\n%s\nwant:\n%s", b.String(), want)
	}
}
