package web

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/state"
	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/traces"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// podSnapshot is a node with one pod, ml/trainer: an init container that
// ended, a sidecar running, a container in a crash loop; a claim made
// from a template and prepared, one whose claim is not made yet; two
// device-plugin devices; events of its own (one a warning whose message
// carries markup) and one of an earlier pod of the same name.
func podSnapshot(now time.Time) state.Snapshot {
	ago := func(d time.Duration) metav1.Time { return metav1.NewTime(now.Add(-d)) }
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "trainer", UID: "uid-trainer", CreationTimestamp: ago(time.Hour)},
		Spec: corev1.PodSpec{
			NodeName: "node-a",
			ResourceClaims: []corev1.PodResourceClaim{
				{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")},
				{Name: "nic", ResourceClaimTemplateName: ptr.To("one-nic")},
			},
			InitContainers: []corev1.Container{
				{Name: "setup", Image: "busybox"},
				{Name: "proxy", Image: "envoy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)},
			},
			Containers: []corev1.Container{{Name: "main", Image: "registry.example.com/trainer:1.0"}, {Name: "later", Image: "x"}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.88.0.7",
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: ago(time.Hour)},
				{Type: corev1.ContainersReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady", Message: "containers with unready status: [main]"},
			},
			ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("trainer-gpu-x7k2p")}},
			InitContainerStatuses: []corev1.ContainerStatus{
				{Name: "setup", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed", ExitCode: 0, FinishedAt: ago(50 * time.Minute)}}},
				{Name: "proxy", Ready: true, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: ago(50 * time.Minute)}}},
			},
			ContainerStatuses: []corev1.ContainerStatus{{
				Name: "main", RestartCount: 3,
				State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s restarting failed container"}},
				LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 137}},
			}},
		},
	}
	event := func(name, typ, reason, msg string, uid types.UID, count int32, last time.Duration) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Namespace: "ml", Name: name},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: "trainer", UID: uid},
			Type:           typ, Reason: reason, Message: msg, Count: count,
			FirstTimestamp: ago(last + time.Minute), LastTimestamp: ago(last), Source: corev1.EventSource{Component: "nodeplug-dramanager"},
		}
	}
	return state.Snapshot{
		Status: map[string]string{},
		Pods:   []*corev1.Pod{pod},
		Events: []*corev1.Event{
			event("old", corev1.EventTypeWarning, "FailedMount", "of the pod before", "uid-earlier", 1, 2*time.Hour),
			event("e1", corev1.EventTypeNormal, "Scheduled", "Successfully assigned ml/trainer to node-a", "uid-trainer", 1, 59*time.Minute),
			event("e2", corev1.EventTypeWarning, "BackOff", "Back-off restarting <script>alert(1)</script>", "uid-trainer", 5, time.Minute),
		},
		Claims: []*dmv1.Claim{{
			Namespace: "ml", Name: "trainer-gpu-x7k2p", Uid: "claim-uid", State: dmv1.ClaimState_CLAIM_STATE_PREPARED,
			Devices: []*dmv1.ClaimDevice{{Driver: "gpu.example.com", Pool: "node-a", Device: "gpu-0"}},
		}},
		Resources: []*dmv1.Resource{resource([]string{"dev-0", "dev-1", "dev-2"}, nil, []string{"dev-0", "dev-1"})},
		Allocations: []*dmv1.Allocation{
			{PodUid: "uid-trainer", ContainerName: "main", ResourceName: "example.com/sample", DeviceIds: []string{"dev-0", "dev-1"}},
			{PodUid: "uid-other", ContainerName: "main", ResourceName: "example.com/sample", DeviceIds: []string{"dev-2"}},
		},
	}
}

func readPage(t *testing.T, ctx context.Context, url, token string) (int, string) {
	t.Helper()
	resp := get(t, ctx, url, token)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}

// TestPodsView: the Pods page lists each pod with its phase, each
// container's state (an init container's exit code, a sidecar running, a
// crash loop's reason and restarts), its claims joined with the
// dramanager's (prepared, with the device; one not made yet), its
// device-plugin devices by its UID (not another pod's), its age and the
// reason of its latest event; a pod's page shows its conditions and its
// events newest first, without the events of an earlier pod of the same
// name; what the API gave is escaped.
func TestPodsView(t *testing.T) {
	st := &snapshots{}
	st.set(podSnapshot(time.Now()))
	srv, token := newTestServer(t, st, traces.NewStore(traces.Limits{}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	code, page := readPage(t, ctx, srv.URL+"/pods", token)
	if code != 200 {
		t.Fatalf("GET /pods: status %d", code)
	}
	for _, want := range []string{
		`<a href="/pods" aria-current="page">Pods</a>`,
		`data-pod="ml/trainer" data-uid="uid-trainer" data-phase="Running"`,
		`<a href="/pods/ml/trainer"`,
		`data-container="setup" data-state="terminated"`, `Completed <span class="muted">exit code</span> <b>0</b>`,
		`data-container="proxy" data-state="running"`, `<code>proxy</code> <span class="muted">(sidecar)</span>`,
		`<span class="state state-waiting">waiting</span> CrashLoopBackOff <span class="muted">· 3 restarts</span>`,
		`data-container="later" data-state="unknown"`,
		`data-claim="gpu" data-state="prepared" data-prepared="true"`, `<a href="/dra#claim-ml-trainer-gpu-x7k2p">trainer-gpu-x7k2p</a>`,
		`<code>gpu.example.com/node-a/gpu-0</code>`,
		`data-claim="nic" data-state="not made yet" data-prepared="false"`, `(from template one-nic)`,
		`data-resource="example.com/sample" data-device="dev-0" data-state="allocated"`,
		`data-last-event="BackOff"`, `title="Back-off restarting &lt;script&gt;alert(1)&lt;/script&gt;"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the Pods page lacks %s", want)
		}
	}
	if strings.Contains(page, `data-device="dev-2"`) {
		t.Error("the Pods page shows another pod's device")
	}
	if t.Failed() {
		t.Fatalf("page:\n%s", page)
	}

	code, page = readPage(t, ctx, srv.URL+"/pods/ml/trainer", token)
	if code != 200 {
		t.Fatalf("GET /pods/ml/trainer: status %d", code)
	}
	for _, want := range []string{
		`<title>Pod ml/trainer · nodeplug console</title>`, `<a href="/pods" aria-current="page">Pods</a>`,
		`data-events="/events?view=pod&amp;id=ml%2Ftrainer"`,
		`node <b>node-a</b>`, `IP <code>10.88.0.7</code>`, `<a class="find" href="/traces?q=uid-trainer"`,
		`data-condition="PodScheduled" data-status="True"`,
		`<td>ContainersReady</td><td>False</td><td>ContainersNotReady</td><td>containers with unready status: [main]</td>`,
		`<tr data-type="Warning" data-reason="BackOff"><td class="error">Warning</td><td>BackOff</td><td>Back-off restarting &lt;script&gt;alert(1)&lt;/script&gt;</td><td class="num">5</td>`,
		`<tr data-type="Normal" data-reason="Scheduled">`, `<td>nodeplug-dramanager</td>`,
		`Events, newest first (2)`, `back-off 40s restarting failed container`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the pod's page lacks %s", want)
		}
	}
	if strings.Index(page, `data-reason="BackOff"`) > strings.Index(page, `data-reason="Scheduled"`) {
		t.Error("the events are not newest first")
	}
	if strings.Contains(page, "FailedMount") {
		t.Error("the pod's page shows an event of an earlier pod of the same name")
	}
	if strings.Contains(page, "<script>alert") {
		t.Error("an event's message reached the page unescaped")
	}
	if t.Failed() {
		t.Fatalf("page:\n%s", page)
	}
}

// TestPodPageLive: a pod's page follows the pod: one not there says so,
// then shows it once it is, and its new events as they come; a page or
// event stream of something not NAMESPACE/NAME is refused.
func TestPodPageLive(t *testing.T) {
	st := &snapshots{}
	st.set(state.Snapshot{Status: map[string]string{state.API: "unreachable: connection refused"}})
	srv, token := newTestServer(t, st, traces.NewStore(traces.Limits{}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	events := get(t, ctx, srv.URL+"/events?view=pod&id=ml%2Ftrainer", token)
	defer events.Body.Close()
	ch := readEvents(events.Body)
	first := <-ch
	for _, want := range []string{`id="nopod"`, `Pod ml/trainer is not in the node-local API`, `data-service="apiserver">apiserver: unreachable: connection refused`} {
		if !strings.Contains(first, want) {
			t.Errorf("the first event lacks %s:\n%s", want, first)
		}
	}
	now := time.Now()
	snap := podSnapshot(now)
	st.set(snap)
	next := waitEvent(t, ctx, ch, `data-reason="BackOff"`)
	if strings.Contains(next, `data-reason="Started"`) {
		t.Fatalf("an event before it happened:\n%s", next)
	}
	snap = podSnapshot(now)
	snap.Events = append(snap.Events, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Namespace: "ml", Name: "e3"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "ml", Name: "trainer", UID: "uid-trainer"},
		Type:           corev1.EventTypeNormal, Reason: "Started", LastTimestamp: metav1.NewTime(now),
	})
	st.set(snap)
	waitEvent(t, ctx, ch, `data-reason="Started"`)

	for _, path := range []string{"/events?view=pod&id=trainer", "/events?view=pod&id=ml/a/b", "/events?view=pod&id=%2Ftrainer"} {
		if code, _ := readPage(t, ctx, srv.URL+path, token); code != http.StatusBadRequest {
			t.Errorf("GET %s: status %d, want 400", path, code)
		}
	}
	if code, _ := readPage(t, ctx, srv.URL+"/pods/ml/a/b", token); code != http.StatusNotFound {
		t.Errorf("GET /pods/ml/a/b: status %d, want 404", code)
	}
}

// waitEvent returns the first update from ch that contains want.
func waitEvent(t *testing.T, ctx context.Context, ch <-chan string, want string) string {
	t.Helper()
	for {
		select {
		case got, ok := <-ch:
			if !ok {
				t.Fatalf("the event stream ended before %s", want)
			}
			if strings.Contains(got, want) {
				return got
			}
		case <-ctx.Done():
			t.Fatalf("no update with %s", want)
		}
	}
}

// TestPodsViewEmptyAndOff: with no pod the view says how one gets there;
// with the API not read (--kubeconfig -) it says so and has no status
// line for it.
func TestPodsViewEmptyAndOff(t *testing.T) {
	frag, err := renderFragment("pods", podsOf(state.Snapshot{Status: map[string]string{state.API: ""}}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(frag, "No pod in the node-local API.") || !strings.Contains(frag, `data-service="apiserver">apiserver: synced`) {
		t.Errorf("the empty Pods view:\n%s", frag)
	}
	frag, err = renderFragment("pods", podsOf(state.Snapshot{Status: map[string]string{}, PodsOff: true}, time.Now()))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(frag, "does not read the node-local API") || strings.Contains(frag, `data-service="apiserver"`) {
		t.Errorf("the Pods view without the API:\n%s", frag)
	}
}
