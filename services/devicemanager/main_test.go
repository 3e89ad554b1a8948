package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// proc is a running nodeplug-devicemanager binary.
type proc struct {
	*stack.Process
	client dmv1.DeviceManagerServiceClient
	close  func() // SIGKILL
}

// buildBinaries builds the named binaries into a temporary directory and
// returns it.
func buildBinaries(t *testing.T, names ...string) string {
	t.Helper()
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := stack.Build(ctx, dir, names...); err != nil {
		t.Fatal(err)
	}
	return dir
}

// startProc starts the binary and waits until it serves gRPC.
func startProc(t *testing.T, bin, root string) *proc {
	t.Helper()
	sp, err := stack.Start(bin, []string{"--root-dir", root, "--metrics-listen", "",
		"--grace-period", "1m", "--log-level", "debug"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := sp.GRPCAddr(ctxT(t))
	if err != nil {
		sp.Kill()
		t.Fatal(err)
	}
	conn, err := rpcutil.DialPeer(addr)
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{Process: sp, client: dmv1.NewDeviceManagerServiceClient(conn)}
	p.close = func() {
		_ = conn.Close()
		sp.Kill()
	}
	t.Cleanup(func() {
		p.close()
		if t.Failed() {
			t.Logf("devicemanager log:\n%s", sp.Logs())
		}
	})
	return p
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	t.Cleanup(cancel)
	return ctx
}

// waitLive waits until resource name has one live endpoint and
// allocatable devices, and returns it.
func waitLive(t *testing.T, c dmv1.DeviceManagerServiceClient, name string, allocatable int64) *dmv1.Resource {
	t.Helper()
	var found *dmv1.Resource
	testutil.Eventually(t, fmt.Sprintf("%s live with %d allocatable", name, allocatable), func() error {
		resp, err := c.ListResources(ctxT(t), &dmv1.ListResourcesRequest{})
		if err != nil {
			return err
		}
		for _, r := range resp.GetResources() {
			if r.GetName() == name {
				if r.GetAllocatable() == allocatable && len(r.GetEndpoints()) == 1 &&
					r.GetEndpoints()[0].GetState() == dmv1.EndpointState_ENDPOINT_STATE_LIVE {
					found = r
					return nil
				}
				return fmt.Errorf("last: %v", r)
			}
		}
		return fmt.Errorf("no resource %s", name)
	})
	return found
}

// TestSIGKILLKeepsAllocationsAndRedials kills the devicemanager binary with
// SIGKILL and starts it again: every allocation is restored with an answer
// proto.Equal to the original, and plugins still serving are live again
// without registering anew.
func TestSIGKILLKeepsAllocationsAndRedials(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := filepath.Join(buildBinaries(t, "nodeplug-devicemanager"), "nodeplug-devicemanager")
	root := testutil.TempDir(t)
	dpDir := filepath.Join(root, "device-plugins")
	reg := plugintest.Start(t, sampleplugin.Options{Resource: "example.com/reg", Devices: 4, Preferred: true, PreStartRequired: true, CDI: true,
		SocketPath: filepath.Join(root, "plugins_registry", "reg.sock")})
	first := startProc(t, bin, root)
	legacy := plugintest.Start(t, sampleplugin.Options{Resource: "example.com/legacy", Devices: 2, SocketPath: filepath.Join(dpDir, "legacy.sock")})

	if _, err := first.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
		ResourceName: reg.Resource(), Endpoint: reg.SocketPath(), Versions: []string{pluginapi.Version},
		SocketPath: reg.SocketPath(), Generation: testutil.Generation(t, reg.SocketPath()),
	}); err != nil {
		t.Fatal(err)
	}
	if err := legacy.Register(ctxT(t), filepath.Join(dpDir, "kubelet.sock")); err != nil {
		t.Fatal(err)
	}
	regBefore := waitLive(t, first.client, "example.com/reg", 4)
	legacyBefore := waitLive(t, first.client, "example.com/legacy", 2)

	reqs := []*dmv1.AllocateRequest{
		{PodUid: "pod-a", ContainerName: "main", Resources: []*dmv1.ResourceRequest{{ResourceName: "example.com/reg", Count: 2, MustIncludeDeviceIds: []string{"dev-1"}}}},
		{PodUid: "pod-a", ContainerName: "side", Resources: []*dmv1.ResourceRequest{{ResourceName: "example.com/legacy", Count: 1}, {ResourceName: "example.com/reg", Count: 1}}},
		{PodUid: "pod-b", ContainerName: "main", Resources: []*dmv1.ResourceRequest{{ResourceName: "example.com/legacy", Count: 1}}},
	}
	var answers []*dmv1.AllocateResponse
	for _, r := range reqs {
		a, err := first.client.Allocate(ctxT(t), r)
		if err != nil {
			t.Fatal(err)
		}
		answers = append(answers, a)
	}
	before, err := first.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}

	first.close() // SIGKILL
	if first.Cmd.ProcessState.Success() {
		t.Fatal("the devicemanager exited cleanly; want a SIGKILL")
	}
	second := startProc(t, bin, root)

	regAfter := waitLive(t, second.client, "example.com/reg", 4)
	legacyAfter := waitLive(t, second.client, "example.com/legacy", 2)
	for _, pair := range [][2]*dmv1.Resource{{regBefore, regAfter}, {legacyBefore, legacyAfter}} {
		b, a := pair[0].GetEndpoints()[0], pair[1].GetEndpoints()[0]
		if a.GetEndpoint() != b.GetEndpoint() || a.GetGeneration() != b.GetGeneration() || a.GetRegistrationPath() != b.GetRegistrationPath() {
			t.Fatalf("endpoint changed across the restart:\n%v\n%v", b, a)
		}
	}
	if _, err := os.Stat(legacy.SocketPath()); err != nil {
		t.Fatalf("the live legacy plugin's socket was removed: %v", err)
	}
	after, err := second.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	before.InstanceId, after.InstanceId = "", ""
	if !proto.Equal(before, after) {
		t.Fatalf("allocations differ after SIGKILL:\n%v\n%v", before, after)
	}
	calls := reg.CallCount(sampleplugin.MethodAllocate) + legacy.CallCount(sampleplugin.MethodAllocate)
	prestarts := reg.CallCount(sampleplugin.MethodPreStartContainer)
	for i, r := range reqs {
		a, err := second.client.Allocate(ctxT(t), r)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(a, answers[i]) {
			t.Fatalf("restored answer %d differs:\n%v\n%v", i, a, answers[i])
		}
	}
	if n := reg.CallCount(sampleplugin.MethodAllocate) + legacy.CallCount(sampleplugin.MethodAllocate); n != calls {
		t.Fatalf("restored allocations called the plugins again (%d → %d)", calls, n)
	}
	if reg.CallCount(sampleplugin.MethodPreStartContainer) != prestarts {
		t.Fatal("a restored allocation ran PreStartContainer again")
	}
	if r := waitLive(t, second.client, "example.com/legacy", 2); r.GetFree() != 0 {
		t.Fatalf("legacy free = %d, want 0", r.GetFree())
	}

	// SIGTERM: a clean exit that deregisters and releases nothing.
	if err := second.Stop(testutil.Deadline); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	third := startProc(t, bin, root)
	waitLive(t, third.client, "example.com/reg", 4)
	waitLive(t, third.client, "example.com/legacy", 2)
	final, err := third.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	final.InstanceId = ""
	if !proto.Equal(before, final) {
		t.Fatalf("allocations differ after SIGTERM:\n%v\n%v", before, final)
	}
	testutil.WaitFor(t, "one ListAndWatch stream per plugin", func() bool { return legacy.StreamCount() == 1 && reg.StreamCount() == 1 })
}

// TestSamplePluginKubeletSockAcrossRestart runs nodeplug-sampleplugin in
// kubelet-sock mode against the devicemanager binary: it registers, its
// health flips show, and after a SIGKILL and restart of the devicemanager
// it is live again on the same socket (redialled; its re-Register when
// kubelet.sock reappears is a no-op).
func TestSamplePluginKubeletSockAcrossRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binaries")
	}
	dir := buildBinaries(t, "nodeplug-devicemanager", "nodeplug-sampleplugin")
	bin, sample := filepath.Join(dir, "nodeplug-devicemanager"), filepath.Join(dir, "nodeplug-sampleplugin")
	root := testutil.TempDir(t)
	first := startProc(t, bin, root)

	plugin, err := stack.Start(sample, []string{"--mode", "kubelet-sock", "--resource", "example.com/sample", "--devices", "4",
		"--socket-name", "sample.sock", "--control-listen", "127.0.0.1:0"}, []string{"NODEPLUG_ROOT_DIR=" + root})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plugin.Stop(testutil.Deadline) })
	control, err := plugin.Addr(ctxT(t), "control endpoint listening")
	if err != nil {
		t.Fatal(err)
	}
	before := waitLive(t, first.client, "example.com/sample", 4)
	if ep := before.GetEndpoints()[0]; ep.GetEndpoint() != filepath.Join(root, "device-plugins", "sample.sock") ||
		ep.GetRegistrationPath() != dmv1.RegistrationPath_REGISTRATION_PATH_KUBELET_SOCK {
		t.Fatalf("endpoint = %v", ep)
	}
	resp, err := http.Post("http://"+control+"/health?device=dev-2&healthy=false", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	waitLive(t, first.client, "example.com/sample", 3)

	first.close() // SIGKILL
	second := startProc(t, bin, root)
	after := waitLive(t, second.client, "example.com/sample", 3)
	if a, b := after.GetEndpoints()[0], before.GetEndpoints()[0]; a.GetGeneration() != b.GetGeneration() {
		t.Fatalf("the endpoint was replaced across the restart: %v → %v", b, a)
	}

	// The plugin exits on SIGTERM and removes its socket: its devices turn
	// unhealthy, capacity kept.
	if err := plugin.Stop(testutil.Deadline); err != nil {
		t.Fatalf("sample plugin exit: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "device-plugins", "sample.sock")); !os.IsNotExist(err) {
		t.Fatalf("socket left behind: %v", err)
	}
	testutil.Eventually(t, "devices unhealthy, capacity kept, after the plugin exited", func() error {
		resp, err := second.client.ListResources(ctxT(t), &dmv1.ListResourcesRequest{})
		if err == nil && (len(resp.GetResources()) != 1 || resp.GetResources()[0].GetAllocatable() != 0 || resp.GetResources()[0].GetCapacity() != 4) {
			err = fmt.Errorf("resources: %v", resp)
		}
		return err
	})
}

// The devicemanager's --resource-api-listen is gone (the node-local resource
// API is nodeplug-apiserver's), and so are its DRA flags (--kubeconfig,
// --node-name, --dra-disconnect-delay: the DRA half is nodeplug-dramanager):
// given as a flag or in the environment, each stops the start with an error
// that names the flag and the process that took it over, before the
// devicemanager serves anything.
func TestRemovedFlagsNameTheirService(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := filepath.Join(buildBinaries(t, "nodeplug-devicemanager"), "nodeplug-devicemanager")
	for _, tc := range []struct {
		name        string
		args, env   []string
		flag, owner string
	}{
		{"flag", []string{"--resource-api-listen", "127.0.0.1:0"}, nil, "--resource-api-listen", "nodeplug-apiserver"},
		{"environment", nil, []string{"NODEPLUG_DEVICEMANAGER_RESOURCE_API_LISTEN=127.0.0.1:0"}, "--resource-api-listen", "nodeplug-apiserver"},
		{"kubeconfig", []string{"--kubeconfig", "/etc/kubeconfig"}, nil, "--kubeconfig", "nodeplug-dramanager"},
		{"node name in the environment", nil, []string{"NODEPLUG_DEVICEMANAGER_NODE_NAME=node-1"}, "--node-name", "nodeplug-dramanager"},
		{"disconnect delay", []string{"--dra-disconnect-delay", "1s"}, nil, "--dra-disconnect-delay", "nodeplug-dramanager"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testutil.TempDir(t)
			cmd := exec.CommandContext(ctxT(t), bin, append([]string{"--root-dir", root, "--metrics-listen", ""}, tc.args...)...)
			cmd.Env = append(os.Environ(), tc.env...)
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("the devicemanager with the removed %s: %v, want a failed start\n%s", tc.flag, err, out)
			}
			if !strings.Contains(string(out), tc.flag) || !strings.Contains(string(out), tc.owner) {
				t.Errorf("the error does not name %s and %s:\n%s", tc.flag, tc.owner, out)
			}
			if _, err := os.Stat(layout.APISocket(root, "devicemanager")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the devicemanager's API socket after the refused start: %v, want none", err)
			}
		})
	}
}
