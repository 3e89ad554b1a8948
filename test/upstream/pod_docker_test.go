package upstream

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// A pod of a manifest run by the host's docker engine: the same pod as
// TestDRAPodRunsInPodman's, its containers' CDI devices resolved by the
// dramanager (the engine here has no CDI support) in the test's own spec
// directories, its logs docker's json-file logs linked into the kubelet's
// layout.

// dockerEngine is the host's docker engine, with the probe's image under a
// name of the test's own; the image and every container of it are
// removed when the test ends.
type dockerEngine struct {
	t     *testing.T
	image string
}

func (d *dockerEngine) run(args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctxT(d.t), "docker", args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("docker %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// newDockerEngine imports the probe's image; when docker is absent, its
// engine does not answer, or it resolves CDI devices itself (their specs
// would have to be in its own directories), the test is skipped with the
// reason.
func newDockerEngine(t *testing.T) *dockerEngine {
	t.Helper()
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skipf("docker is not installed: %v", err)
	}
	d := &dockerEngine{t: t}
	if _, err := d.run("version", "--format", "{{.Server.Version}}"); err != nil {
		t.Skipf("the docker engine does not answer: %v", err)
	}
	out, err := d.run("info", "--format", "{{json .CDISpecDirs}}")
	if err != nil {
		t.Skipf("docker info: %v", err)
	}
	var dirs []string
	if err := json.Unmarshal(out, &dirs); err != nil {
		t.Fatalf("docker info's CDISpecDirs %q: %v", out, err)
	}
	if len(dirs) > 0 {
		t.Skipf("the docker engine resolves CDI devices itself, in %v: this test gives the dramanager spec directories of its own, which only an engine without CDI support leaves to it", dirs)
	}
	buildCtrBins(t)
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	d.image = "localhost/nodeplug-ctrprobe-" + hex.EncodeToString(b) + ":1.0"
	t.Cleanup(d.cleanup)
	tarball := filepath.Join(testutil.TempDir(t), "rootfs.tar")
	if err := probeRootfs(filepath.Join(binDir, "ctrprobe"), tarball); err != nil {
		t.Fatal(err)
	}
	if _, err := d.run("import", tarball, d.image); err != nil {
		t.Skipf("docker cannot import an image here: %v", err)
	}
	return d
}

// cleanup removes every container of the test's image, and the image.
func (d *dockerEngine) cleanup() {
	out, err := d.run("ps", "--all", "--quiet", "--no-trunc", "--filter", "ancestor="+d.image)
	if err != nil {
		d.t.Errorf("listing the test's containers: %v", err)
	}
	if ids := strings.Fields(string(out)); len(ids) > 0 {
		d.t.Errorf("containers of the test's image left: %v", ids)
		if _, err := d.run(append([]string{"rm", "--force", "--"}, ids...)...); err != nil {
			d.t.Errorf("removing them: %v", err)
		}
	}
	if _, err := d.run("rmi", "--force", "--", d.image); err != nil && !strings.Contains(err.Error(), "No such image") {
		d.t.Errorf("removing the test's image: %v", err)
	}
}

// containers lists the names of docker's containers of the pod.
func (d *dockerEngine) containers(podUID string) []string {
	d.t.Helper()
	out, err := d.run("ps", "--all", "--filter", "label=io.kubernetes.pod.uid="+podUID, "--format", "{{.Names}}")
	if err != nil {
		d.t.Fatal(err)
	}
	return strings.Fields(string(out))
}

// TestDRAPodRunsInDocker: TestDRAPodRunsInPodman's pod (a claim from a
// template, an init and an app container using it, the app container with
// two devices of the sample device plugin too) run by docker: each
// container sees the claim's and the plugin's CDI edits, the pod ends
// Succeeded with docker:// container IDs, nodeplugctl logs prints what each
// container printed (a link to docker's log), and deleting the pod
// removes its containers, its logs and its claim.
func TestDRAPodRunsInDocker(t *testing.T) {
	const driverName = "docker.test.nodeplug.io"
	dk := newDockerEngine(t)
	dirs := testutil.TempDir(t)
	cdiDir, draCDI := filepath.Join(dirs, "nodeplug"), filepath.Join(dirs, "dra")
	for _, d := range []string{cdiDir, draCDI} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	setCDIDirs(t, cdiDir, draCDI, cdiDir)
	n := startDRANodeEnv(t, longDelay,
		"NODEPLUG_DRAMANAGER_CONTAINER_RUNTIME=docker",
		"NODEPLUG_DRAMANAGER_CONTAINER_NETWORK=none",
		"NODEPLUG_DRAMANAGER_DOCKER_CDI_SPEC_DIRS="+cdiDir+":"+draCDI)
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi")}
	n.startDriver(driverName, devs, "--cdi-dir", draCDI)
	cs := n.operator()
	n.waitSlices(cs, driverName, devs)
	n.waitDriver(driverName, oneServing(1, ""))
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
    args: ["-env", "user_color", "-env", "POD_NAME", "-env", "NODEPLUG_DEVICES",
      "/dev/nodeplug/dev-0", "/dev/nodeplug/dev-0/id", "/dev/nodeplug/dev-1", "/dev/dev-0", "/dev/dev-1"]
    env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    resources:
      limits:
        example.com/sample: 2
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: one-gpu
`, dk.image))
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
		if tm := st.State.Terminated; tm == nil || tm.ExitCode != 0 || tm.Reason != "Completed" || !strings.HasPrefix(st.ContainerID, "docker://") {
			t.Errorf("container %s: state %+v, id %q, want terminated, Completed, exit 0, a docker:// ID", st.Name, st.State, st.ContainerID)
		}
	}
	claimName := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName

	for _, c := range []struct {
		container string
		env       map[string]string
	}{
		{"init", map[string]string{"user_color": "teal"}},
		{"main", map[string]string{"user_color": "teal", "POD_NAME": "trainer"}},
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
	logs, _ := filepath.Glob(filepath.Join(n.root, "pod-logs", "ml_trainer_*", "main", "0.log"))
	if len(logs) != 1 {
		t.Fatalf("the main container's log: %v, want one", logs)
	}
	if dest, err := os.Readlink(logs[0]); err != nil || !strings.HasSuffix(dest, "-json.log") {
		t.Errorf("%s links to %q (%v), want docker's json-file log", logs[0], dest, err)
	}

	testutil.Eventually(t, "the claim of the ended pod deleted and its devices freed", func() error {
		if _, err := cs.ResourceV1().ResourceClaims("ml").Get(ctxT(t), claimName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: %v", claimName, err)
		}
		if a := n.allocations(string(pod.UID)); len(a) != 0 {
			return fmt.Errorf("devices still allocated: %v", a)
		}
		return nil
	})
	if got := dk.containers(string(pod.UID)); len(got) != 2 {
		t.Fatalf("docker holds %v of the ended pod, want its two containers", got)
	}
	n.ctl("delete", "pod", "ml/trainer")
	testutil.Eventually(t, "the deleted pod's containers and logs removed", func() error {
		if got := dk.containers(string(pod.UID)); len(got) != 0 {
			return fmt.Errorf("docker still holds %v", got)
		}
		logs, _ := filepath.Glob(filepath.Join(n.root, "pod-logs", "ml_trainer_*"))
		if len(logs) != 0 {
			return fmt.Errorf("logs left: %v", logs)
		}
		return nil
	})
}
