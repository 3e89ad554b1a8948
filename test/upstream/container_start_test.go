package upstream

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/nodeplug/nodeplug/internal/containerstest"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// The container-start tests: StartContainer's answer taken by a real
// container runtime. podman (4.3.1 here) starts a container of an image
// the test builds from cmd/ctrprobe, with the CDI devices StartContainer
// named, and the probe inside reports what the container got.
//
// podman reads CDI specs from /etc/cdi and /var/run/cdi only: 4.3.1 has no
// cdi_spec_dirs setting (containers.conf accepts the key and ignores it).
// So every podman command runs under cmd/cdinamespace, in a mount namespace
// of its own where /var/run/cdi is the test's spec directories (read-only)
// and /etc/cdi is empty; the host's directories are not touched. podman's
// storage, run and temporary directories are the test's own too
// (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF).

// ctrBins builds, once, what these tests run beside the services: the
// sample plugin, the probe and the namespace helper.
var ctrBins struct {
	once sync.Once
	err  error
}

func buildCtrBins(t *testing.T) {
	t.Helper()
	ctrBins.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if ctrBins.err = stack.Build(ctx, binDir, "nodeplug-sampleplugin"); ctrBins.err != nil {
			return
		}
		build := exec.CommandContext(ctx, "go", "build", "-o", binDir+string(filepath.Separator), "./cmd/ctrprobe", "./cmd/cdinamespace")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := build.CombinedOutput(); err != nil {
			ctrBins.err = fmt.Errorf("build ctrprobe and cdinamespace: %v\n%s", err, out)
		}
	})
	if ctrBins.err != nil {
		t.Fatal(ctrBins.err)
	}
}

// podman runs podman over the test's own storage, with the CDI spec
// directories each command is given.
type podman struct {
	t     *testing.T
	bin   string
	dir   string
	env   []string
	empty string // a spec directory with nothing in it
}

const probeImage = "localhost/nodeplug-ctrprobe:test"

// newPodman imports the probe's image into a new podman store and checks a
// container of it runs; when podman is absent or cannot run a container
// here, the test is skipped with the reason.
func newPodman(t *testing.T) *podman {
	t.Helper()
	bin, err := exec.LookPath("podman")
	if err != nil {
		t.Skipf("podman is not installed: %v", err)
	}
	buildCtrBins(t)
	dir := testutil.TempDir(t)
	p := &podman{t: t, bin: bin, dir: dir, empty: filepath.Join(dir, "no-cdi")}
	for _, d := range []string{"rootfs", "no-cdi"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	p.env = containerstest.Configure(t, dir)
	// When the test ends, after the node it ran stopped and before the
	// storage is removed: no container is left running over it, even when
	// the test failed with its pods still running.
	t.Cleanup(func() {
		if out, stderr, err := p.run(nil, "rm", "--all", "--force", "--time=0"); err != nil {
			t.Errorf("removing the test's containers: %v\n%s%s", err, out, stderr)
		}
	})
	tarball := filepath.Join(dir, "rootfs.tar")
	if err := containerstest.RootfsTar(tarball, filepath.Join(binDir, "ctrprobe"), "ctrprobe"); err != nil {
		t.Fatal(err)
	}
	if out, stderr, err := p.run(nil, "import", tarball, probeImage); err != nil {
		t.Skipf("podman cannot import an image here: %v\n%s%s", err, out, stderr)
	}
	if out, stderr, err := p.run(nil, p.runArgs(nil, "-env", "PATH")...); err != nil {
		t.Skipf("podman cannot run a container here: %v\n%s%s", err, out, stderr)
	}
	t.Logf("podman runs containers here (%s, storage %s)", bin, dir)
	return p
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// run runs one podman command under cdinamespace with /var/run/cdi showing
// specDirs (none: an empty directory), and returns its output.
func (p *podman) run(specDirs []string, args ...string) (stdout, stderr []byte, err error) {
	p.t.Helper()
	scratch, err := os.MkdirTemp(p.dir, "ns-")
	if err != nil {
		p.t.Fatal(err)
	}
	if len(specDirs) == 0 {
		specDirs = []string{p.empty}
	}
	cmdArgs := []string{"-scratch", scratch}
	for _, d := range specDirs {
		cmdArgs = append(cmdArgs, "-dir", d)
	}
	cmdArgs = append(append(cmdArgs, "--", p.bin), args...)
	cmd := exec.CommandContext(ctxT(p.t), filepath.Join(binDir, "cdinamespace"), cmdArgs...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err = cmd.Run()
	return out.Bytes(), errb.Bytes(), err
}

// runArgs are the arguments of a podman run of the probe with the CDI
// devices, reporting on probeArgs.
func (p *podman) runArgs(devices []string, probeArgs ...string) []string {
	args := []string{"run", "--rm", "--pull=never", "--network=none"}
	for _, d := range devices {
		args = append(args, "--device", d)
	}
	return append(append(args, probeImage, "/ctrprobe"), probeArgs...)
}

// probeReport is cmd/ctrprobe's output.
type probeReport struct {
	Env   map[string]*string `json:"env"`
	Paths map[string]struct {
		Exists     bool     `json:"exists"`
		Kind       string   `json:"kind"`
		MountPoint bool     `json:"mountPoint"`
		ReadOnly   bool     `json:"readOnly"`
		Device     string   `json:"device"`
		Content    string   `json:"content"`
		Entries    []string `json:"entries"`
		Err        string   `json:"error"`
	} `json:"paths"`
}

// probe runs a container with the CDI devices, its specs in specDirs, and
// returns what the probe saw of the env variables and paths.
func (p *podman) probe(specDirs, devices, envs []string, paths ...string) probeReport {
	p.t.Helper()
	var args []string
	for _, e := range envs {
		args = append(args, "-env", e)
	}
	out, stderr, err := p.run(specDirs, p.runArgs(devices, append(args, paths...)...)...)
	if err != nil {
		p.t.Fatalf("podman run with devices %v (specs in %v): %v\n%s%s", devices, specDirs, err, out, stderr)
	}
	var r probeReport
	if err := json.Unmarshal(out, &r); err != nil {
		p.t.Fatalf("the probe's report: %v\n%s\n%s", err, out, stderr)
	}
	p.t.Logf("in the container (devices %v): %s", devices, out)
	return r
}

// startSamplePlugin runs nodeplug-sampleplugin for resource on the node,
// registering through plugins_registry, until the test ends, and waits
// until its devices are allocatable.
func (n *draNode) startSamplePlugin(resource string, devices int, args ...string) *stack.Process {
	n.t.Helper()
	args = append([]string{"--root-dir", n.root, "--resource", resource, "--devices", fmt.Sprint(devices)}, args...)
	p, err := stack.Start(filepath.Join(binDir, "nodeplug-sampleplugin"), args, nil)
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() {
		_ = p.Stop(10 * time.Second)
		if n.t.Failed() {
			n.t.Logf("sample plugin %s log:\n%s", resource, p.Logs())
		}
	})
	client := n.dmClient()
	testutil.Eventually(n.t, resource+" allocatable", func() error {
		resp, err := client.ListResources(ctxT(n.t), &dmv1.ListResourcesRequest{})
		if err != nil {
			return err
		}
		for _, r := range resp.GetResources() {
			if r.GetName() == resource && r.GetAllocatable() == int64(devices) {
				return nil
			}
		}
		return fmt.Errorf("resources %v", resp.GetResources())
	})
	return p
}

// allocateFor allocates count devices of resource to the pod's container
// and returns their IDs.
func (n *draNode) allocateFor(pod, ns, name, container, resource string, count int64) []string {
	n.t.Helper()
	resp, err := n.dmClient().Allocate(ctxT(n.t), &dmv1.AllocateRequest{
		PodUid: pod, PodNamespace: ns, PodName: name, ContainerName: container,
		Resources: []*dmv1.ResourceRequest{{ResourceName: resource, Count: count}},
	})
	if err != nil {
		n.t.Fatalf("Allocate %d %s for %s/%s: %v", count, resource, pod, container, err)
	}
	return resp.GetAllocations()[0].GetDeviceIds()
}

// startContainer calls StartContainer.
func (n *draNode) startContainer(pod, container string) (*dmv1.StartContainerResponse, error) {
	return n.dmClient().StartContainer(ctxT(n.t), &dmv1.StartContainerRequest{PodUid: pod, ContainerName: container})
}

// allocations are the pod's allocations as ListAllocations shows them.
func (n *draNode) allocations(pod string) []*dmv1.Allocation {
	n.t.Helper()
	resp, err := n.dmClient().ListAllocations(ctxT(n.t), &dmv1.ListAllocationsRequest{PodUid: pod})
	if err != nil {
		n.t.Fatalf("ListAllocations %s: %v", pod, err)
	}
	return resp.GetAllocations()
}

// specFile is the spec file in dir that defines the CDI device name (its
// kind and device name in the file's content), "" when there is none.
func specFile(t *testing.T, dir, name string) string {
	t.Helper()
	kind, dev, _ := strings.Cut(name, "=")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			continue
		}
		var spec struct {
			Kind    string `json:"kind"`
			Devices []struct {
				Name string `json:"name"`
			} `json:"devices"`
		}
		if json.Unmarshal(data, &spec) == nil && spec.Kind == kind &&
			slices.ContainsFunc(spec.Devices, func(d struct {
				Name string `json:"name"`
			}) bool {
				return d.Name == dev
			}) {
			return filepath.Join(dir, e.Name())
		}
	}
	return ""
}

// hostDevices makes the host side of the sample plugin's mounts under dir:
// dev-0 a directory holding a file "id", dev-1 a file, each naming itself.
func hostDevices(t *testing.T, dir string) {
	t.Helper()
	if err := os.Mkdir(filepath.Join(dir, "dev-0"), 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "dev-0", "id"), "dev-0 on the host\n")
	writeFile(t, filepath.Join(dir, "dev-1"), "dev-1 on the host\n")
}

// checkSampleDevices checks the container saw the sample plugin's edits for
// devices dev-0 and dev-1: the env, each mount (read-only, from the host
// directories of hostDevices) and each device node (the host's /dev/null,
// a char device 1:3).
func checkSampleDevices(t *testing.T, r probeReport) {
	t.Helper()
	if v := r.Env["NODEPLUG_DEVICES"]; v == nil || *v != "dev-0,dev-1" {
		t.Errorf("NODEPLUG_DEVICES in the container: %v, want dev-0,dev-1", ptrVal(v))
	}
	dir := r.Paths["/dev/nodeplug/dev-0"]
	if !dir.Exists || dir.Kind != "dir" || !dir.MountPoint || !dir.ReadOnly || !slices.Equal(dir.Entries, []string{"id"}) {
		t.Errorf("/dev/nodeplug/dev-0 in the container: %+v, want a read-only mounted directory holding id", dir)
	}
	if f := r.Paths["/dev/nodeplug/dev-0/id"]; f.Kind != "file" || f.Content != "dev-0 on the host\n" {
		t.Errorf("/dev/nodeplug/dev-0/id in the container: %+v, want the host's file", f)
	}
	if f := r.Paths["/dev/nodeplug/dev-1"]; f.Kind != "file" || !f.MountPoint || !f.ReadOnly || f.Content != "dev-1 on the host\n" {
		t.Errorf("/dev/nodeplug/dev-1 in the container: %+v, want the host's file mounted read-only", f)
	}
	for _, id := range []string{"dev-0", "dev-1"} {
		if d := r.Paths["/dev/"+id]; d.Kind != "char" || d.Device != "1:3" {
			t.Errorf("/dev/%s in the container: %+v, want a char device 1:3 (the host's /dev/null)", id, d)
		}
	}
}

// sampleProbe is what the probe is asked about for the sample plugin's
// devices dev-0 and dev-1.
var sampleProbe = []string{"/dev/nodeplug/dev-0", "/dev/nodeplug/dev-0/id", "/dev/nodeplug/dev-1", "/dev/dev-0", "/dev/dev-1"}

// TestContainerStartDevicePlugin: the sample plugin's devices allocated to
// a container, StartContainer names nodeplug's own CDI device for them,
// whose spec is in the devicemanager's spec directory; a podman container
// started with it has the plugin's env, its mounts and its device nodes.
// Release removes the spec, and podman no longer resolves the name.
func TestContainerStartDevicePlugin(t *testing.T) {
	pm := newPodman(t)
	n := startDRANode(t, longDelay)
	cdiDir := filepath.Join(n.root, "cdi") // the stack's --cdi-spec-dir
	hostDir := testutil.TempDir(t)
	hostDevices(t, hostDir)
	const res = "example.com/sample"
	n.startSamplePlugin(res, 2, "--mount-host-dir", hostDir)
	const pod, ctr = "pod-dp-1", "main"
	if ids := n.allocateFor(pod, "default", "dp", ctr, res, 2); !slices.Equal(ids, []string{"dev-0", "dev-1"}) {
		t.Fatalf("allocated %v, want dev-0 and dev-1", ids)
	}

	resp, err := n.startContainer(pod, ctr)
	if err != nil {
		t.Fatalf("StartContainer %s/%s: %v", pod, ctr, err)
	}
	want := "nodeplug.io/container=" + pod + "_" + ctr
	if !slices.Equal(resp.GetCdiDevices(), []string{want}) || !slices.Contains(resp.GetCdiSpecDirs(), cdiDir) || len(resp.GetPreStartedResources()) != 0 {
		t.Fatalf("StartContainer = %v, want cdi_devices [%s] resolved in %s, no resource pre-started (the plugin does not ask)", resp, want, cdiDir)
	}
	if e := resp.GetEdits(); e.GetEnvs()["NODEPLUG_DEVICES"] != "dev-0,dev-1" || len(e.GetMounts()) != 2 || len(e.GetDevices()) != 2 {
		t.Fatalf("StartContainer's edits %v, want the plugin's env, two mounts and two device nodes", e)
	}
	spec := specFile(t, cdiDir, want)
	if spec == "" {
		t.Fatalf("no spec file in %s defines %s", cdiDir, want)
	}
	checkSampleDevices(t, pm.probe([]string{cdiDir}, resp.GetCdiDevices(), []string{"NODEPLUG_DEVICES"}, sampleProbe...))

	// The second start of the container is the same.
	again, err := n.startContainer(pod, ctr)
	if err != nil || !slices.Equal(again.GetCdiDevices(), resp.GetCdiDevices()) {
		t.Fatalf("StartContainer again = %v, %v; want %v", again, err, resp.GetCdiDevices())
	}

	rel, err := n.dmClient().Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: pod})
	if err != nil || rel.GetReleasedDevices() != 2 {
		t.Fatalf("Release %s = %v, %v; want 2 devices released", pod, rel, err)
	}
	if _, err := os.Stat(spec); !os.IsNotExist(err) {
		t.Fatalf("the spec %s after Release: %v, want it removed", spec, err)
	}
	if _, err := n.startContainer(pod, ctr); status.Code(err) != codes.NotFound {
		t.Fatalf("StartContainer after Release: %v, want NOT_FOUND", err)
	}
	out, stderr, err := pm.run([]string{cdiDir}, pm.runArgs(resp.GetCdiDevices())...)
	if err == nil || !strings.Contains(string(stderr), "unresolvable CDI devices") {
		t.Fatalf("podman run with %v after Release: %v, want unresolvable CDI devices\n%s%s", resp.GetCdiDevices(), err, out, stderr)
	}
}

// opaqueConfig is the driver's opaque config params for request "gpu" (a
// JSON object, which the upstream test driver sets as env variables
// user_<key>).
func opaqueConfig(driverName, params string) resourcev1.DeviceClaimConfiguration {
	return resourcev1.DeviceClaimConfiguration{
		Requests: []string{"gpu"},
		DeviceConfiguration: resourcev1.DeviceConfiguration{Opaque: &resourcev1.OpaqueDeviceConfiguration{
			Driver: driverName, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

// setCDIDirs gives the devicemanagers the test starts dir as
// --cdi-spec-dir and dirs as --cdi-spec-dirs, through their environment
// variables (a repeatable flag's values separated by ':').
func setCDIDirs(t *testing.T, dir string, dirs ...string) {
	t.Setenv("NODEPLUG_DEVICEMANAGER_CDI_SPEC_DIR", dir)
	t.Setenv("NODEPLUG_DEVICEMANAGER_CDI_SPEC_DIRS", strings.Join(dirs, ":"))
}

// TestContainerStartDRA: a claim prepared by the upstream test driver,
// whose --cdi-dir is one of the devicemanager's --cdi-spec-dirs and not its
// --cdi-spec-dir, for a container that also holds sample plugin devices.
// StartContainer names nodeplug's own CDI device first, then the claim's
// CDI ID; a podman container started with them has the plugin's edits and
// the env the driver's spec sets (the claim's opaque config, and its
// claim_<claim>_<request> variable). Release removes nodeplug's spec, and
// the driver's once it unprepared the claim.
func TestContainerStartDRA(t *testing.T) {
	pm := newPodman(t)
	dirs := testutil.TempDir(t)
	cdiDir, draCDI := filepath.Join(dirs, "nodeplug"), filepath.Join(dirs, "dra")
	setCDIDirs(t, cdiDir, draCDI, cdiDir)
	n := startDRANode(t, longDelay)
	const driverName = "ctr.test.nodeplug.io"
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi")}
	n.startDriver(driverName, devs, "--cdi-dir", draCDI)
	cs := n.operator()
	n.waitSlices(cs, driverName, devs)
	n.waitDriver(driverName, oneServing(1, ""))
	claim := n.createClassAndClaim(cs, driverName, "default", "train", opaqueConfig(driverName, `{"color":"teal"}`))
	hostDir := testutil.TempDir(t)
	hostDevices(t, hostDir)
	const res = "example.com/sample"
	n.startSamplePlugin(res, 2, "--mount-host-dir", hostDir)

	const pod = "pod-dra-1"
	n.allocateFor(pod, "default", "trainer", "main", res, 2)
	prep, err := n.draClient().PrepareResources(ctxT(t), podPrepare(pod, "default", "trainer", claim.Name))
	if err != nil {
		t.Fatalf("PrepareResources: %v", err)
	}
	claimID := cdiID(driverName, string(claim.UID), "gpu")
	if got := container(t, prep, "main").GetCdiDeviceIds(); !slices.Equal(got, []string{claimID}) {
		t.Fatalf("PrepareResources: container main's CDI IDs %v, want [%s]", got, claimID)
	}
	if specFile(t, draCDI, claimID) == "" {
		t.Fatalf("the driver wrote no spec of %s in its --cdi-dir %s", claimID, draCDI)
	}

	resp, err := n.startContainer(pod, "main")
	if err != nil {
		t.Fatalf("StartContainer %s/main: %v", pod, err)
	}
	own := "nodeplug.io/container=" + pod + "_main"
	if !slices.Equal(resp.GetCdiDevices(), []string{own, claimID}) ||
		!slices.Contains(resp.GetCdiSpecDirs(), cdiDir) || !slices.Contains(resp.GetCdiSpecDirs(), draCDI) {
		t.Fatalf("StartContainer = %v, want cdi_devices [%s %s] resolved in %s and %s", resp, own, claimID, draCDI, cdiDir)
	}
	r := pm.probe([]string{cdiDir, draCDI}, resp.GetCdiDevices(), []string{"NODEPLUG_DEVICES", "user_color", "claim_train_gpu"}, sampleProbe...)
	checkSampleDevices(t, r)
	if v := r.Env["user_color"]; v == nil || *v != "teal" {
		t.Errorf("user_color (the claim's config) in the container: %v, want teal", ptrVal(v))
	}
	if v := r.Env["claim_train_gpu"]; v == nil || *v != "true" {
		t.Errorf("claim_train_gpu in the container: %v, want true", ptrVal(v))
	}
	if _, err := n.startContainer(pod, "sidecar"); status.Code(err) != codes.NotFound {
		t.Errorf("StartContainer of the sidecar (no devices, no claim): %v, want NOT_FOUND", err)
	}

	spec := specFile(t, cdiDir, own)
	n.release(pod, 1)
	if spec == "" || specFile(t, cdiDir, own) != "" {
		t.Fatalf("nodeplug's spec of %s (%q) after Release: want it removed from %s", own, spec, cdiDir)
	}
	testutil.Eventually(t, "the driver's spec of "+claimID+" removed", func() error {
		if f := specFile(t, draCDI, claimID); f != "" {
			return fmt.Errorf("%s is there", f)
		}
		return nil
	})
}

// TestContainerStartFailures (no container runtime needed): a plugin that
// asks for PreStartContainer and fails it fails the start with its message,
// and the allocation stays; once the plugin succeeds again, so does the
// start. A plugin's CDI name that no spec defines fails the start with
// FAILED_PRECONDITION naming it and the spec directories.
func TestContainerStartFailures(t *testing.T) {
	buildCtrBins(t)
	dirs := testutil.TempDir(t)
	cdiDir, static := filepath.Join(dirs, "dynamic"), filepath.Join(dirs, "static")
	if err := os.Mkdir(static, 0o755); err != nil {
		t.Fatal(err)
	}
	setCDIDirs(t, cdiDir, static, cdiDir)
	n := startDRANode(t, longDelay)

	const preRes, msg = "example.com/prestart", "device reset failed: dev-0 is busy"
	pre := n.startSamplePlugin(preRes, 2, "--prestart", "--prestart-error", msg, "--control-listen", "127.0.0.1:0")
	control, err := pre.Addr(ctxT(t), "control endpoint listening")
	if err != nil {
		t.Fatal(err)
	}
	ids := n.allocateFor("pod-pre", "default", "pre", "main", preRes, 1)
	_, err = n.startContainer("pod-pre", "main")
	if c := status.Code(err); (c != codes.Internal && c != codes.Unavailable) || !strings.Contains(status.Convert(err).Message(), msg) {
		t.Fatalf("StartContainer with a failing PreStartContainer: %v, want INTERNAL or UNAVAILABLE with %q", err, msg)
	}
	t.Logf("StartContainer with a failing PreStartContainer: %v", err)
	allocs := n.allocations("pod-pre")
	if len(allocs) != 1 || allocs[0].GetResourceName() != preRes || !slices.Equal(allocs[0].GetDeviceIds(), ids) || allocs[0].GetContainerName() != "main" {
		t.Fatalf("allocations after the failed start: %v, want main's %s %v kept", allocs, preRes, ids)
	}
	req, err := http.NewRequestWithContext(ctxT(t), http.MethodPost, "http://"+control+"/failure?method=PreStartContainer", nil)
	if err != nil {
		t.Fatal(err)
	}
	hr, err := http.DefaultClient.Do(req)
	if err != nil || hr.StatusCode != http.StatusNoContent {
		t.Fatalf("clear the plugin's failure: %v, %v", hr, err)
	}
	_ = hr.Body.Close()
	resp, err := n.startContainer("pod-pre", "main")
	if err != nil || !slices.Equal(resp.GetPreStartedResources(), []string{preRes}) {
		t.Fatalf("StartContainer once PreStartContainer succeeds: %v, %v; want %s pre-started", resp, err, preRes)
	}

	const cdiRes = "example.com/cdi"
	n.startSamplePlugin(cdiRes, 1, "--cdi")
	n.allocateFor("pod-cdi", "default", "cdi", "main", cdiRes, 1)
	_, err = n.startContainer("pod-cdi", "main")
	want := fmt.Sprintf("CDI device %q does not resolve in the CDI spec directories %s, %s", cdiRes+"=dev-0", static, cdiDir)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("StartContainer naming a CDI device no spec defines: %v, want FAILED_PRECONDITION with %q", err, want)
	}
	t.Logf("StartContainer naming a CDI device no spec defines: %v", err)
	if allocs := n.allocations("pod-cdi"); len(allocs) != 1 {
		t.Errorf("allocations after the unresolved start: %v, want the one kept", allocs)
	}
}
