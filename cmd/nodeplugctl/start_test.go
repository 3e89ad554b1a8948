package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// TestStartContainer runs nodeplugctl start against a real devicemanager,
// built once for its subtests, each over a root dir of its own.
func TestStartContainer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the devicemanager")
	}
	bin := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*testutil.Deadline)
	defer cancel()
	if err := stack.Build(ctx, bin, "nodeplug-devicemanager", "nodeplug-dramanager"); err != nil {
		t.Fatal(err)
	}
	t.Run("SamplePlugin", func(t *testing.T) { testStartSamplePlugin(t, bin) })
	t.Run("Errors", func(t *testing.T) { testStartErrors(t, bin) })
}

// startStack runs the devicemanager in bin over a fresh root dir (its CDI
// specs in <root>/cdi, where names also resolve: internal/stack), with the
// dramanager it asks for the containers' claims (none here), and registers a sample device plugin on its kubelet.sock for each of opts;
// it returns the root dir once every resource is allocatable.
func startStack(t *testing.T, bin string, opts ...sampleplugin.Options) (string, *stack.Processes) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*testutil.Deadline)
	defer cancel()
	root := testutil.TempDir(t)
	ps := stack.NewProcesses(bin, root)
	t.Cleanup(func() {
		ps.StopAll()
		if p := ps.Process("devicemanager"); t.Failed() && p != nil {
			t.Logf("devicemanager log:\n%s", p.Logs())
		}
	})
	for _, svc := range []string{"devicemanager", "dramanager"} {
		if err := ps.Start(ctx, svc); err != nil {
			t.Fatal(err)
		}
	}
	cc, err := rpcutil.DialPeer(ps.Addr("devicemanager"))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	dm := dmv1.NewDeviceManagerServiceClient(cc)
	for i, o := range opts {
		o.SocketPath = filepath.Join(layout.DevicePluginsDir(root), fmt.Sprintf("p%d.sock", i))
		p := plugintest.Start(t, o)
		if err := p.Register(ctx, layout.KubeletSocket(root)); err != nil {
			t.Fatalf("Register %s: %v", o.Resource, err)
		}
		testutil.Eventually(t, o.Resource+" allocatable", func() error {
			resp, err := dm.ListResources(ctx, &dmv1.ListResourcesRequest{})
			if err != nil {
				return err
			}
			for _, r := range resp.GetResources() {
				if r.GetName() == o.Resource && r.GetAllocatable() == int64(o.Devices) {
					return nil
				}
			}
			return fmt.Errorf("resources %v", resp.GetResources())
		})
	}
	return root, ps
}

// ctlOK runs nodeplugctl against root and fails t unless it exits 0.
func ctlOK(t *testing.T, root string, args ...string) string {
	t.Helper()
	code, out, errOut := runCLI(t, append([]string{"--root-dir", root}, args...)...)
	if code != exitOK {
		t.Fatalf("nodeplugctl %q: exit %d: %s%s", args, code, out, errOut)
	}
	return out
}

// specFiles returns the nodeplug CDI spec files in dir.
func specFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "nodeplug.io-container_*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// A start of a container given sample-plugin devices prints the runtime's
// arguments (nodeplug's CDI device holds the plugin's envs, mounts and
// device nodes; the annotation is passed on), tells the plugin that asks
// for it at every start, and the release removes the container's spec.
func testStartSamplePlugin(t *testing.T, bin string) {
	root, _ := startStack(t, bin, sampleplugin.Options{Resource: "example.com/sample", Devices: 4, PreStartRequired: true})
	cdiDir := filepath.Join(root, "cdi")
	ctlOK(t, root, "allocate", "--pod", "pod-1", "--container", "main", "example.com/sample=2")
	if files := specFiles(t, cdiDir); len(files) != 1 {
		t.Fatalf("CDI specs after Allocate: %q, want one", files)
	}

	const want = "--device nodeplug.io/container=pod-1_main --annotation nodeplug.io/resource=example.com/sample\n"
	for _, o := range []string{"podman", "docker"} {
		if out := ctlOK(t, root, "start", "--pod", "pod-1", "--container", "main", "-o", o); out != want {
			t.Errorf("start -o %s:\n%q\nwant\n%q", o, out, want)
		}
	}
	out := ctlOK(t, root, "start", "--pod", "pod-1", "--container", "main")
	wantText := "pod pod-1 container main: CDI devices (resolved in " + cdiDir + ")\n" +
		"  nodeplug.io/container=pod-1_main\n" +
		"annotations: nodeplug.io/resource=example.com/sample\n" +
		"pre-started: example.com/sample\n"
	if out != wantText {
		t.Errorf("start:\n%s\nwant:\n%s", out, wantText)
	}
	var resp dmv1.StartContainerResponse
	out = ctlOK(t, root, "-o", "json", "start", "--pod", "pod-1", "--container", "main")
	if err := protojson.Unmarshal([]byte(out), &resp); err != nil {
		t.Fatalf("start -o json: %v\n%s", err, out)
	}
	if e := resp.GetEdits(); e.GetEnvs()["NODEPLUG_DEVICES"] != "dev-0,dev-1" || len(e.GetMounts()) != 2 || len(e.GetDevices()) != 2 ||
		len(resp.GetCdiDevices()) != 1 || len(resp.GetPreStartedResources()) != 1 {
		t.Errorf("start -o json:\n%s", out)
	}

	if out := ctlOK(t, root, "release", "--pod", "pod-1"); out != "released 2 device(s) of pod pod-1\n" {
		t.Errorf("release: %q", out)
	}
	if files := specFiles(t, cdiDir); len(files) != 0 {
		t.Errorf("CDI specs after Release: %q, want none", files)
	}
}

// A container with nothing is NOT_FOUND; a plugin's CDI name that no spec
// defines fails the start with the devicemanager's message whole, and
// resolves once a spec defines it.
func testStartErrors(t *testing.T, bin string) {
	root, ps := startStack(t, bin, sampleplugin.Options{Resource: "example.com/cdi", Devices: 2, CDI: true})
	cdiDir := filepath.Join(root, "cdi")

	code, out, errOut := runCLI(t, "--root-dir", root, "start", "--pod", "nobody", "--container", "main")
	const notFound = "nodeplugctl start: start pod nobody container main: pod nobody container main has no devices allocated and no DRA claims prepared: not found\n"
	if code != exitError || out != "" || errOut != notFound {
		t.Errorf("start of a container with nothing: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, notFound)
	}

	ctlOK(t, root, "allocate", "--pod", "pod-2", "--container", "main", "example.com/cdi=1")
	code, out, errOut = runCLI(t, "--root-dir", root, "start", "--pod", "pod-2", "--container", "main", "-o", "podman")
	wantErr := `nodeplugctl start: start pod pod-2 container main: CDI device "example.com/cdi=dev-0" does not resolve in the CDI spec directories ` +
		cdiDir + ": failed precondition\n"
	if code != exitError || out != "" || errOut != wantErr {
		t.Errorf("start naming an undefined CDI device: exit %d, stdout %q, stderr %q; want %q", code, out, errOut, wantErr)
	}

	spec := `{"cdiVersion":"0.5.0","kind":"example.com/cdi","devices":[{"name":"dev-0","containerEdits":{"env":["CDI_DEV=0"]}}]}`
	if err := os.WriteFile(filepath.Join(cdiDir, "example.com-cdi.json"), []byte(spec), 0o644); err != nil {
		t.Fatal(err)
	}
	out = ctlOK(t, root, "start", "--pod", "pod-2", "--container", "main", "-o", "podman")
	want := "--device nodeplug.io/container=pod-2_main --device example.com/cdi=dev-0 --annotation nodeplug.io/resource=example.com/cdi\n"
	if out != want {
		t.Errorf("start -o podman:\n%q\nwant\n%q", out, want)
	}

	// Without the dramanager the devicemanager cannot know the
	// container's claims: the start fails, naming the dramanager, and the
	// allocation stays.
	ps.Kill("dramanager")
	code, out, errOut = runCLI(t, "--root-dir", root, "start", "--pod", "pod-2", "--container", "main")
	if code != exitError || out != "" || !strings.Contains(errOut, "nodeplug-dramanager at "+layout.APISocket(root, "dramanager")) || !strings.Contains(errOut, "ListPodClaims") {
		t.Errorf("start without the dramanager: exit %d, stdout %q, stderr %q; want an error naming nodeplug-dramanager and its socket", code, out, errOut)
	}
	if out := ctlOK(t, root, "allocations"); !strings.Contains(out, "pod-2") {
		t.Errorf("allocations after the failed start:\n%s\nwant pod-2's", out)
	}
}

func TestStartUsage(t *testing.T) {
	for _, args := range [][]string{
		{"start"},
		{"start", "--pod", "p"},
		{"start", "--pod", "p", "--container", "c", "-o", "yaml"},
		{"start", "--pod", "p", "--container", "c", "extra"},
	} {
		if code, _, stderr := runCLI(t, args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d: %s", args, code, exitUsage, stderr)
		}
	}
}

func TestRenderStart(t *testing.T) {
	resp := &dmv1.StartContainerResponse{PodUid: "p", ContainerName: "c", CdiSpecDirs: []string{"/etc/cdi", "/var/run/cdi"}}
	var b strings.Builder
	if err := renderStart(&b, resp); err != nil {
		t.Fatal(err)
	}
	want := "pod p container c: CDI devices (resolved in /etc/cdi, /var/run/cdi)\n" +
		"  none: the container's devices need no edits\n" +
		"pre-started: none (no plugin asks for PreStartContainer)\n"
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
	if line, err := runtimeArgs(resp); line != "" || err != nil {
		t.Errorf("runtime arguments of nothing: %q, %v", line, err)
	}
}

// An annotation that an unquoted $(...) would split or expand is refused
// rather than printed.
func TestRuntimeArgsRefusesWhatAShellChanges(t *testing.T) {
	for _, v := range []string{"a b", "a\tb", "a\nb", "*", "dev-[0]", "a?", "$HOME", "'x'", `"x"`, "a;b", "é"} {
		resp := &dmv1.StartContainerResponse{CdiDevices: []string{"nodeplug.io/container=p_c"},
			Edits: &dmv1.ContainerEdits{Annotations: map[string]string{"k": v}}}
		if line, err := runtimeArgs(resp); err == nil || !strings.Contains(err.Error(), "use -o json") {
			t.Errorf("annotation %q: %q, %v; want it refused", v, line, err)
		}
	}
	resp := &dmv1.StartContainerResponse{CdiDevices: []string{"nodeplug.io/container=p_c", "vendor.com/gpu=gpu-0:1"},
		Edits: &dmv1.ContainerEdits{Annotations: map[string]string{"b.io/x": "1,2", "a.io/y": "u@h:/p%+"}}}
	line, err := runtimeArgs(resp)
	want := "--device nodeplug.io/container=p_c --device vendor.com/gpu=gpu-0:1 --annotation a.io/y=u@h:/p%+ --annotation b.io/x=1,2"
	if err != nil || line != want {
		t.Errorf("got %q, %v; want %q", line, err, want)
	}
}

// fakeRelease answers Release with released claims.
type fakeRelease struct {
	dmv1.UnimplementedDeviceManagerServiceServer
}

func (fakeRelease) Release(_ context.Context, req *dmv1.ReleaseRequest) (*dmv1.ReleaseResponse, error) {
	if req.GetContainerName() != "" {
		return &dmv1.ReleaseResponse{ReleasedDevices: 1}, nil
	}
	return &dmv1.ReleaseResponse{ReleasedDevices: 0, ReleasedClaims: 2}, nil
}

// release says how many DRA claims the pod was dropped from, when any.
func TestReleasePrintsReleasedClaims(t *testing.T) {
	sock := serveFake(t, func(s *grpc.Server) { dmv1.RegisterDeviceManagerServiceServer(s, fakeRelease{}) })
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pod", "pod-1"}, "released 0 device(s) and 2 DRA claim(s) of pod pod-1\n"},
		{[]string{"--pod", "pod-1", "--container", "main"}, "released 1 device(s) of pod pod-1 container main\n"},
	} {
		code, out, errOut := runCLI(t, append([]string{"--devicemanager-addr", sock, "release"}, tc.args...)...)
		if code != exitOK || out != tc.want {
			t.Errorf("release %q: exit %d, %q%s; want %q", tc.args, code, out, errOut, tc.want)
		}
	}
}
