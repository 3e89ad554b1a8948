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

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/nodeplug/nodeplug/internal/containerstest"
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
	if err := containerstest.RootfsTar(tarball, filepath.Join(binDir, "ctrprobe"), "ctrprobe"); err != nil {
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
	pod := runTrainerPod(t, n, cs, driverName, dk.image, "docker://")
	logs, _ := filepath.Glob(filepath.Join(n.root, "pod-logs", "ml_trainer_*", "main", "0.log"))
	if len(logs) != 1 {
		t.Fatalf("the main container's log: %v, want one", logs)
	}
	if dest, err := os.Readlink(logs[0]); err != nil || !strings.HasSuffix(dest, "-json.log") {
		t.Errorf("%s links to %q (%v), want docker's json-file log", logs[0], dest, err)
	}

	if got := dk.containers(string(pod.UID)); len(got) != 2 {
		t.Fatalf("docker holds %v of the ended pod, want its two containers", got)
	}
	n.ctl("delete", "pod", "ml/trainer")
	testutil.Eventually(t, "the deleted pod's containers and logs removed", func() error {
		if got := dk.containers(string(pod.UID)); len(got) != 0 {
			return fmt.Errorf("docker still holds %v", got)
		}
		return trainerLogsGone(n)
	})
}
