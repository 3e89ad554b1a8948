package upstream

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// TestDRAPodKillEachService: pods start and stop while each nodeplug
// service in turn is killed with SIGKILL and started again. After each
// kill the pod applied just before it runs, with its claim's CDI edits,
// and the pod deleted just before it is gone with everything it held;
// at every step the driver holds prepared exactly the claims of the pods
// that exist (each prepared once), nodeplug lists exactly those as
// prepared, and podman holds containers of those pods only. Deleting the
// last pod leaves nothing.
func TestDRAPodKillEachService(t *testing.T) {
	const driverName = "kill-each.test.nodeplug.io"
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi"), gpu("gpu-1", "a100", 1, "40Gi"), gpu("gpu-2", "a100", 2, "40Gi")}
	n, d, pm, cs := podmanNodeWith(t, driverName, devs)
	n.waitSlices(cs, driverName, devs)
	base := filepath.Join(n.root, "base.yaml")
	writeFile(t, base, classAndTemplate(driverName))
	n.ctl("apply", "-f", base)

	kills := []struct {
		name    string
		restart func()
	}{
		{"apiserver", func() { n.killAPI(); n.startAPI() }},
		{"watcher", func() { n.svc.Kill("watcher"); n.startSvc("watcher") }},
		{"reconciler", func() { n.svc.Kill("reconciler"); n.startSvc("reconciler") }},
		{"devicemanager", func() { n.svc.Kill("devicemanager"); n.startSvc("devicemanager") }},
		{"dramanager", func() {
			n.killDRA()
			n.startDRA()
			n.waitDriver(driverName, oneServing(1, ""))
		}},
	}
	var live *corev1.Pod
	for i, k := range kills {
		name := fmt.Sprintf("job-%d", i)
		manifest := filepath.Join(n.root, name+".yaml")
		writeFile(t, manifest, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: ml
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: %s
    command: ["/ctrprobe", "-env", "user_color", "-wait"]
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: one-gpu
`, name, podImage))
		// The new pod starts and the last one stops while the service is
		// killed.
		n.ctl("apply", "-f", manifest)
		if live != nil {
			n.ctl("delete", "pod", "ml/"+live.Name)
		}
		k.restart()
		t.Logf("%s killed and started again while %s started", k.name, name)

		if live != nil {
			n.waitPodFreed(d, pm, cs, live)
		}
		live = n.waitProbeRunning(cs, "ml", name)
		var r probeReport
		if out := n.ctl("logs", "ml/"+name); json.Unmarshal(out, &r) != nil || r.Env["user_color"] == nil || *r.Env["user_color"] != "teal" {
			t.Errorf("after the kill of %s, nodeplugctl logs ml/%s: %s, want the report with user_color teal", k.name, name, out)
		}
		n.checkNothingLost(d, pm, cs, k.name, live)
	}
	n.ctl("delete", "pod", "ml/"+live.Name)
	n.waitPodFreed(d, pm, cs, live)
	n.checkNothingLost(d, pm, cs, "the last deletion")
}

// startSvc starts the service of n.svc (again, on the same address).
func (n *draNode) startSvc(name string) {
	n.t.Helper()
	if err := n.svc.Start(ctxT(n.t), name); err != nil {
		n.t.Fatal(err)
	}
}

// waitProbeRunning waits until the pod's one container runs and has
// printed its report, and returns the pod.
func (n *draNode) waitProbeRunning(cs kubernetes.Interface, ns, name string) *corev1.Pod {
	n.t.Helper()
	var pod *corev1.Pod
	testutil.Eventually(n.t, "pod "+ns+"/"+name+" Running", func() (err error) {
		if pod, err = cs.CoreV1().Pods(ns).Get(ctxT(n.t), name, metav1.GetOptions{}); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodRunning || len(pod.Status.ContainerStatuses) != 1 || pod.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("phase %s, containers %v", pod.Status.Phase, states(pod.Status.ContainerStatuses))
		}
		if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			return fmt.Errorf("claim statuses %v", pod.Status.ResourceClaimStatuses)
		}
		return nil
	})
	return pod
}

// waitPodFreed waits until the deleted pod's containers are gone, its
// claim (made from a template) is deleted and the driver no longer holds
// it prepared, and checks the driver was asked once to unprepare it.
func (n *draNode) waitPodFreed(d *claimsDriver, pm *podman, cs kubernetes.Interface, pod *corev1.Pod) {
	n.t.Helper()
	claim := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	var uid string
	testutil.Eventually(n.t, "pod "+pod.Name+" gone with everything it held", func() error {
		if _, err := cs.CoreV1().Pods(pod.Namespace).Get(ctxT(n.t), pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("the pod: %v", err)
		}
		if err := pm.gone(string(pod.UID)); err != nil {
			return err
		}
		if _, err := cs.ResourceV1().ResourceClaims(pod.Namespace).Get(ctxT(n.t), claim, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: %v", claim, err)
		}
		s := d.readState()
		uid = claimUID(s, claim)
		if uid == "" {
			return fmt.Errorf("the driver never prepared claim %s", claim)
		}
		if s.prepared(uid) {
			return fmt.Errorf("the driver still holds claim %s prepared", claim)
		}
		return nil
	})
	if got := d.readState().calls("NodeUnprepareResources", uid); got != 1 {
		n.t.Errorf("the driver was asked %d times to unprepare claim %s of pod %s, want once", got, claim, pod.Name)
	}
}

// claimUID is the UID of the claim named name in the driver's calls.
func claimUID(s driverState, name string) string {
	for _, c := range s.Calls {
		for _, cl := range c.Request.Claims {
			if cl.Name == name {
				return cl.UID
			}
		}
	}
	return ""
}

// checkNothingLost checks, after step, that the driver holds prepared
// exactly the claims of the pods (each prepared once), that the
// dramanager lists exactly those claims as prepared, and that podman
// holds the containers of those pods alone.
func (n *draNode) checkNothingLost(d *claimsDriver, pm *podman, cs kubernetes.Interface, step string, pods ...*corev1.Pod) {
	n.t.Helper()
	var want, uids []string
	for _, p := range pods {
		c, err := cs.ResourceV1().ResourceClaims(p.Namespace).Get(ctxT(n.t), *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			n.t.Fatalf("after %s: the claim of pod %s: %v", step, p.Name, err)
		}
		want = append(want, string(c.UID))
		uids = append(uids, string(p.UID))
	}
	slices.Sort(want)
	s := d.readState()
	var held []string
	for _, p := range s.Prepared {
		held = append(held, p.UID)
		if got := s.calls("NodePrepareResources", p.UID); got != 1 {
			n.t.Errorf("after %s: the driver was asked %d times to prepare claim %s, want once", step, got, p.Name)
		}
	}
	slices.Sort(held)
	if !slices.Equal(held, want) {
		n.t.Errorf("after %s: the driver holds %v prepared, want the claims of the pods, %v", step, s.Prepared, want)
	}
	resp, err := n.draClient().ListClaims(ctxT(n.t), &dmv1.ListClaimsRequest{})
	if err != nil {
		n.t.Fatalf("after %s: ListClaims: %v", step, err)
	}
	var listed []string
	for _, c := range resp.GetClaims() {
		if c.GetState() == dmv1.ClaimState_CLAIM_STATE_PREPARED {
			listed = append(listed, c.GetUid())
		}
	}
	slices.Sort(listed)
	if !slices.Equal(listed, want) {
		n.t.Errorf("after %s: ListClaims shows %v prepared, want %v", step, resp.GetClaims(), want)
	}
	out, stderr, err := pm.run(nil, "ps", "-a", "--format", `{{index .Labels "io.kubernetes.pod.uid"}} {{.Names}}`)
	if err != nil {
		n.t.Fatalf("podman ps: %v\n%s", err, stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		if uid, _, _ := strings.Cut(line, " "); !slices.Contains(uids, uid) {
			n.t.Errorf("after %s: podman holds %q, of none of the pods %v", step, line, uids)
		}
	}
}
