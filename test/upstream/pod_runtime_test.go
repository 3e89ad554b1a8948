package upstream

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
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
)

// The pods of a manifest run by podman: the dramanager's pod worker runs
// their containers with the CDI devices of their claims, writes their
// states and keeps their logs, which nodeplugctl logs reads.

// podImage is the name the manifests use for the probe's image: the test
// tags the image it built with it, and nothing is ever pulled.
const podImage = "registry.example.com/nodeplug/probe:1.0"

// wrapper writes an executable that runs podman as p.run does, over the
// test's storage and with /var/run/cdi showing specDirs, for the
// dramanager's --podman-path.
func (p *podman) wrapper(specDirs ...string) string {
	p.t.Helper()
	var b strings.Builder
	b.WriteString("#!/bin/sh\nset -e\n")
	for _, e := range p.env {
		k, v, _ := strings.Cut(e, "=")
		fmt.Fprintf(&b, "export %s=%q\n", k, v)
	}
	fmt.Fprintf(&b, "scratch=$(mktemp -d -p %q ns-XXXXXX)\n", p.dir)
	fmt.Fprintf(&b, "exec unshare --mount --propagation private %q -scratch \"$scratch\"", filepath.Join(binDir, "cdinamespace"))
	for _, d := range specDirs {
		fmt.Fprintf(&b, " -dir %q", d)
	}
	fmt.Fprintf(&b, " -- %q \"$@\"\n", p.bin)
	path := filepath.Join(p.dir, "podman-wrapper")
	if err := os.WriteFile(path, []byte(b.String()), 0o700); err != nil {
		p.t.Fatal(err)
	}
	return path
}

// podmanNode is a DRA node whose dramanager runs the pods' containers in
// podman, with a DRA driver whose CDI specs are in its own directory.
func podmanNode(t *testing.T, driverName string) (*draNode, *podman, kubernetes.Interface) {
	t.Helper()
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi")}
	n, _, pm, cs := podmanNodeWith(t, driverName, devs)
	n.waitSlices(cs, driverName, devs)
	return n, pm, cs
}

// podmanNodeWith is podmanNode with a claims driver publishing devs,
// started with the further flags extra (--counters-file,
// --device-metadata); it returns once the driver serves, without waiting
// for its slices.
func podmanNodeWith(t *testing.T, driverName string, devs []resourcev1.Device, extra ...string) (*draNode, *claimsDriver, *podman, kubernetes.Interface) {
	t.Helper()
	pm := newPodman(t)
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skipf("unshare (util-linux) is not installed: %v", err)
	}
	if out, stderr, err := pm.run(nil, "tag", probeImage, podImage); err != nil {
		t.Fatalf("podman tag %s %s: %v\n%s%s", probeImage, podImage, err, out, stderr)
	}
	// The devicemanager's CDI specs (the device plugins') and the driver's,
	// each in a directory of its own, both resolved by the devicemanager's
	// StartContainer and by podman.
	dirs := testutil.TempDir(t)
	cdiDir, draCDI := filepath.Join(dirs, "nodeplug"), filepath.Join(dirs, "dra")
	for _, d := range []string{cdiDir, draCDI} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	setCDIDirs(t, cdiDir, draCDI, cdiDir)
	n := startDRANodeEnv(t, longDelay,
		"NODEPLUG_DRAMANAGER_CONTAINER_RUNTIME=podman", "NODEPLUG_DRAMANAGER_PODMAN_PATH="+pm.wrapper(cdiDir, draCDI),
		// Each podman command runs in a mount namespace of its own, with
		// /run its own: a network namespace a container's start made
		// under /run/netns would be gone for the next command.
		"NODEPLUG_DRAMANAGER_PODMAN_NETWORK=none")
	d := n.startClaimsDriver(driverName, devs, append([]string{"--cdi-dir", draCDI}, extra...)...)
	cs := n.operator()
	n.waitDriver(driverName, oneServing(1, ""))
	return n, d, pm, cs
}

// TestDRAPodRunsInPodman: a driver's manifest applied as it is — a pod
// whose claim comes from a template with the driver's opaque config, an
// init container and an app container both using it, the app container
// also with two devices of the sample device plugin in its limits — runs
// in podman: the init container first, then the app container, each
// seeing the claim's CDI edits (the driver's environment variables), the
// app container also the plugin's env, mounts and device nodes; the pod
// ends Succeeded (restartPolicy Never), its claim and devices are then
// released, and nodeplugctl logs prints what each container printed.
// Deleting the pod removes its containers and its logs, and its claim.
func TestDRAPodRunsInPodman(t *testing.T) {
	const driverName = "pods.test.nodeplug.io"
	n, pm, cs := podmanNode(t, driverName)
	pod := runTrainerPod(t, n, cs, driverName, podImage, "podman://")
	if got := pm.containers(string(pod.UID)); len(got) != 2 {
		t.Fatalf("podman holds %v of the ended pod, want its two containers", got)
	}
	n.ctl("delete", "pod", "ml/trainer")
	testutil.Eventually(t, "the deleted pod's containers and logs removed", func() error {
		if err := pm.gone(string(pod.UID)); err != nil {
			return err
		}
		return trainerLogsGone(n)
	})
}

// runTrainerPod runs, on n whose dramanager runs containers, the pod of
// TestDRAPodRunsInPodman with image (containers' IDs beginning with
// idPrefix) up to its end, checks what each container saw, and waits for
// its claim to be deleted and its devices freed; it returns the pod.
func runTrainerPod(t *testing.T, n *draNode, cs kubernetes.Interface, driverName, image, idPrefix string) *corev1.Pod {
	t.Helper()
	hostDir := testutil.TempDir(t)
	hostDevices(t, hostDir)
	n.startSamplePlugin("example.com/sample", 2, "--mount-host-dir", hostDir)
	manifest := filepath.Join(n.root, "pod.yaml")
	writeFile(t, manifest, classAndTemplate(driverName)+fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata:
  name: trainer
  namespace: ml
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: init
    image: %[1]s
    imagePullPolicy: Never
    command: ["/ctrprobe", "-env", "user_color"]
    resources:
      claims:
      - name: gpu
  containers:
  - name: main
    image: %[1]s
    command: ["/ctrprobe"]
    args: ["-env", "user_color", "-env", "POD_NAME", "-env", "GREETING", "-env", "NODEPLUG_DEVICES",
      "/dev/nodeplug/dev-0", "/dev/nodeplug/dev-0/id", "/dev/nodeplug/dev-1", "/dev/dev-0", "/dev/dev-1"]
    env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: GREETING
      value: hello $(POD_NAME)
    resources:
      limits:
        example.com/sample: 2
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: one-gpu
`, image))
	t.Logf("$ nodeplugctl apply -f pod.yaml\n%s", n.ctl("apply", "-f", manifest))

	var pod *corev1.Pod
	testutil.Eventually(t, "pod trainer Succeeded", func() error {
		var err error
		if pod, err = cs.CoreV1().Pods("ml").Get(ctxT(t), "trainer", metav1.GetOptions{}); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("phase %s, init %v, containers %v", pod.Status.Phase, states(pod.Status.InitContainerStatuses), states(pod.Status.ContainerStatuses))
		}
		return nil
	})
	for _, st := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		if tm := st.State.Terminated; tm == nil || tm.ExitCode != 0 || tm.Reason != "Completed" || !strings.HasPrefix(st.ContainerID, idPrefix) {
			t.Errorf("container %s: state %+v, id %q, want terminated, Completed, exit 0, a %s ID", st.Name, st.State, st.ContainerID, idPrefix)
		}
	}
	claimName := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName

	for _, c := range []struct {
		container string
		env       map[string]string
	}{
		{"init", map[string]string{"user_color": "teal"}},
		{"main", map[string]string{"user_color": "teal", "POD_NAME": "trainer", "GREETING": "hello trainer"}},
	} {
		out := n.ctl("logs", "ml/trainer", "-c", c.container)
		var r probeReport
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("nodeplugctl logs ml/trainer -c %s: %v\n%s", c.container, err, out)
		}
		for k, want := range c.env {
			if v := r.Env[k]; v == nil || *v != want {
				t.Errorf("%s in container %s: %v, want %q", k, c.container, ptrVal(v), want)
			}
		}
		if c.container == "main" {
			checkSampleDevices(t, r)
		}
	}
	t.Logf("$ nodeplugctl pods\n%s", n.ctl("pods"))

	// An ended pod's claims are released: the claim made for it is
	// deleted once its driver unprepared it; its containers stay, with
	// their logs, until the pod is deleted.
	testutil.Eventually(t, "the claim of the ended pod deleted and its devices freed", func() error {
		if _, err := cs.ResourceV1().ResourceClaims("ml").Get(ctxT(t), claimName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: %v", claimName, err)
		}
		if a := n.allocations(string(pod.UID)); len(a) != 0 {
			return fmt.Errorf("devices still allocated: %v", a)
		}
		return nil
	})
	return pod
}

// trainerLogsGone says why the logs of runTrainerPod's pod are not gone.
func trainerLogsGone(n *draNode) error {
	if logs, _ := filepath.Glob(filepath.Join(n.root, "pod-logs", "ml_trainer_*")); len(logs) != 0 {
		return fmt.Errorf("logs left: %v", logs)
	}
	return nil
}

// states shows container statuses in a line.
func states(sts []corev1.ContainerStatus) string {
	var parts []string
	for _, s := range sts {
		switch {
		case s.State.Running != nil:
			parts = append(parts, s.Name+": running")
		case s.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("%s: exited %d", s.Name, s.State.Terminated.ExitCode))
		case s.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("%s: waiting %s %s", s.Name, s.State.Waiting.Reason, s.State.Waiting.Message))
		}
	}
	return strings.Join(parts, "; ")
}

// containers lists the names of podman's containers of the pod.
func (p *podman) containers(podUID string) []string {
	p.t.Helper()
	out, stderr, err := p.run(nil, "ps", "-a", "--filter", "label=io.kubernetes.pod.uid="+podUID, "--format", "{{.Names}}")
	if err != nil {
		p.t.Fatalf("podman ps: %v\n%s", err, stderr)
	}
	return strings.Fields(string(out))
}

// classAndTemplate is the manifests' namespace ml, the driver's
// DeviceClass, and template one-gpu with the driver's opaque config
// (color: teal, which the driver's CDI spec sets as user_color).
func classAndTemplate(driverName string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: ml
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: %[1]s
spec:
  selectors:
  - cel:
      expression: device.driver == "%[1]s"
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
          deviceClassName: %[1]s
      config:
      - opaque:
          driver: %[1]s
          parameters:
            color: teal
`, driverName)
}

// TestDRAPodRunningAcrossKills: a long-running pod's container runs on
// through kill -9 of every nodeplug service at once; the
// dramanager started again takes it over (one container, its first
// start, still running), and deleting the pod then stops it, removes it
// and releases its claim.
func TestDRAPodRunningAcrossKills(t *testing.T) {
	const driverName = "kills.test.nodeplug.io"
	n, pm, cs := podmanNode(t, driverName)
	manifest := filepath.Join(n.root, "pod.yaml")
	writeFile(t, manifest, classAndTemplate(driverName)+fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata:
  name: server
  namespace: ml
spec:
  terminationGracePeriodSeconds: 20
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
`, podImage))
	n.ctl("apply", "-f", manifest)
	running := func() (*corev1.Pod, error) {
		pod, err := cs.CoreV1().Pods("ml").Get(ctxT(t), "server", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if pod.Status.Phase != corev1.PodRunning || len(pod.Status.ContainerStatuses) != 1 || pod.Status.ContainerStatuses[0].State.Running == nil {
			return nil, fmt.Errorf("phase %s, containers %v", pod.Status.Phase, states(pod.Status.ContainerStatuses))
		}
		return pod, nil
	}
	var pod *corev1.Pod
	testutil.Eventually(t, "pod server Running", func() (err error) {
		pod, err = running()
		return err
	})
	id := pod.Status.ContainerStatuses[0].ContainerID
	claimName := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	want := []string{fmt.Sprintf("k8s_main_server_ml_%s_0", pod.UID)}

	for _, name := range []string{"reconciler", "devicemanager", "watcher"} {
		n.svc.Kill(name)
	}
	n.killDRA()
	n.killAPI()
	n.startAPI()
	for _, name := range []string{"watcher", "devicemanager"} {
		if err := n.svc.Start(ctxT(t), name); err != nil {
			t.Fatal(err)
		}
	}
	n.startDRA()
	if err := n.svc.Start(ctxT(t), "reconciler"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "pod server Running after the kills, on its first container", func() error {
		p, err := running()
		if err != nil {
			return err
		}
		if got := p.Status.ContainerStatuses[0]; got.ContainerID != id || got.RestartCount != 0 {
			return fmt.Errorf("container %s (restarts %d), want %s", got.ContainerID, got.RestartCount, id)
		}
		if got := pm.containers(string(pod.UID)); !slices.Equal(got, want) {
			return fmt.Errorf("podman holds %v, want %v", got, want)
		}
		return nil
	})
	var r probeReport
	if out := n.ctl("logs", "ml/server"); json.Unmarshal(out, &r) != nil || r.Env["user_color"] == nil || *r.Env["user_color"] != "teal" {
		t.Errorf("nodeplugctl logs ml/server: %s, want the report with user_color teal", out)
	}

	n.ctl("delete", "pod", "ml/server")
	testutil.Eventually(t, "the deleted pod's container removed and its claim deleted", func() error {
		if err := pm.gone(string(pod.UID)); err != nil {
			return err
		}
		if _, err := cs.ResourceV1().ResourceClaims("ml").Get(ctxT(t), claimName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: %v", claimName, err)
		}
		return nil
	})
}

// TestPodDevicePluginLimits (no container runtime needed): a pod's
// device-plugin limits are allocated by the devicemanager before the pod
// is bound; a pod asking for more than the node has stays Pending and
// Unschedulable with an UnexpectedAdmissionError event naming the
// resource; deleting the pod frees its devices.
func TestPodDevicePluginLimits(t *testing.T) {
	buildCtrBins(t)
	n := startDRANode(t, longDelay)
	const res = "example.com/sample"
	n.startSamplePlugin(res, 2)
	cs := n.operator()
	manifest := filepath.Join(n.root, "pods.yaml")
	pod := func(name string, count int) string {
		return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata:
  name: %s
spec:
  containers:
  - name: main
    image: registry.example.com/app:1.0
    resources:
      limits:
        %s: %d
`, name, res, count)
	}
	writeFile(t, manifest, pod("fits", 2)+pod("too-big", 3))
	n.ctl("apply", "-f", manifest)

	var fits *corev1.Pod
	testutil.Eventually(t, "pod fits bound with its two devices", func() (err error) {
		if fits, err = cs.CoreV1().Pods("default").Get(ctxT(t), "fits", metav1.GetOptions{}); err != nil {
			return err
		}
		if fits.Spec.NodeName == "" {
			return fmt.Errorf("not bound: %v", fits.Status.Conditions)
		}
		if a := n.allocations(string(fits.UID)); len(a) != 1 || len(a[0].GetDeviceIds()) != 2 {
			return fmt.Errorf("allocations %v", a)
		}
		return nil
	})
	testutil.Eventually(t, "pod too-big refused with the devicemanager's reason", func() error {
		p, err := cs.CoreV1().Pods("default").Get(ctxT(t), "too-big", metav1.GetOptions{})
		if err != nil {
			return err
		}
		var cond *corev1.PodCondition
		for i := range p.Status.Conditions {
			if p.Status.Conditions[i].Type == corev1.PodScheduled {
				cond = &p.Status.Conditions[i]
			}
		}
		if p.Spec.NodeName != "" || cond == nil || cond.Status != corev1.ConditionFalse || cond.Reason != corev1.PodReasonUnschedulable || !strings.Contains(cond.Message, res) {
			return fmt.Errorf("node %q, scheduled %+v", p.Spec.NodeName, cond)
		}
		events, err := cs.CoreV1().Events("default").List(ctxT(t), metav1.ListOptions{FieldSelector: "involvedObject.name=too-big"})
		if err != nil {
			return err
		}
		for _, e := range events.Items {
			if e.Reason == "UnexpectedAdmissionError" && strings.Contains(e.Message, res) {
				return nil
			}
		}
		return fmt.Errorf("no UnexpectedAdmissionError event naming %s in %v", res, events.Items)
	})
	n.ctl("delete", "pod", "fits", "too-big")
	testutil.Eventually(t, "the deleted pod's devices freed", func() error {
		if a := n.allocations(string(fits.UID)); len(a) != 0 {
			return fmt.Errorf("allocations %v", a)
		}
		return nil
	})
}

// gone says why the pod's containers are not all gone: podman holds one,
// or a process of one still runs.
func (p *podman) gone(podUID string) error {
	if got := p.containers(podUID); len(got) != 0 {
		return fmt.Errorf("podman still holds %v", got)
	}
	if procs := processesOf(podUID); len(procs) != 0 {
		return fmt.Errorf("processes of the pod's containers still run: %v", procs)
	}
	return nil
}

// processesOf lists the processes whose command line names the pod's UID:
// the conmon of each of its containers does (the container's name holds
// it), as long as the container runs.
func processesOf(podUID string) []string {
	var out []string
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), podUID) {
			continue
		}
		out = append(out, filepath.Base(filepath.Dir(f))+": "+strings.ReplaceAll(string(b), "\x00", " "))
	}
	return out
}
