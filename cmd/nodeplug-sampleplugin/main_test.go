package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type started struct {
	p       *sampleplugin.Plugin
	control string
}

// runPlugin runs the sample plugin in-process until the test ends.
func runPlugin(t *testing.T, args ...string) started {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	readyc := make(chan started, 1)
	done := make(chan int)
	go func() {
		done <- run(ctx, args, io.Discard, func(p *sampleplugin.Plugin, control string) { readyc <- started{p, control} })
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("exit code %d", code)
		}
	})
	select {
	case s := <-readyc:
		return s
	case code := <-done:
		t.Fatalf("plugin exited with %d", code)
	case <-time.After(testutil.Deadline):
		t.Fatal("plugin not ready")
	}
	return started{}
}

func waitHealthy(t *testing.T, p *sampleplugin.Plugin, want int) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%d healthy devices", want), func() error {
		n := 0
		for _, d := range p.Devices() {
			if d.Health == pluginapi.Healthy {
				n++
			}
		}
		if n != want {
			return fmt.Errorf("%d healthy", n)
		}
		return nil
	})
}

func TestPluginsRegistryModeAndHealthControl(t *testing.T) {
	// The root dir comes from NODEPLUG_ROOT_DIR, shared by every binary.
	root := testutil.TempDir(t)
	t.Setenv("NODEPLUG_ROOT_DIR", root)
	s := runPlugin(t, "--resource", "example.com/gpu", "--devices", "3", "--control-listen", "127.0.0.1:0", "--preferred")
	sock := filepath.Join(layout.PluginsRegistryDir(root), "example-com_gpu.sock")
	if s.p.SocketPath() != sock || !unixsock.IsSocket(sock) {
		t.Fatalf("socket %s", s.p.SocketPath())
	}
	conn, err := rpcutil.DialPeer(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil || info.Name != "example.com/gpu" || info.Endpoint != sock || info.Type != registerapi.DevicePlugin {
		t.Fatalf("GetInfo = %v, %v", info, err)
	}
	opts, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.GetPreferredAllocationAvailable || opts.PreStartRequired {
		t.Fatalf("options = %v, %v", opts, err)
	}

	post := func(q string, want int) {
		t.Helper()
		resp, err := http.Post("http://"+s.control+"/health?"+q, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("POST /health?%s: %d, want %d", q, resp.StatusCode, want)
		}
	}
	post("device=dev-1&healthy=false", http.StatusNoContent)
	waitHealthy(t, s.p, 2)
	post("device=nope&healthy=false", http.StatusNotFound)
	post("device=dev-1&healthy=maybe", http.StatusBadRequest)
	resp, err := http.Get("http://" + s.control + "/devices")
	if err != nil {
		t.Fatal(err)
	}
	var devs []struct{ ID, Health string }
	err = json.NewDecoder(resp.Body).Decode(&devs)
	resp.Body.Close()
	if err != nil || len(devs) != 3 || devs[1].Health != pluginapi.Unhealthy {
		t.Fatalf("GET /devices = %v, %v", devs, err)
	}
	post("device=dev-1&healthy=true", http.StatusNoContent)
	waitHealthy(t, s.p, 3)

	// Signals: SIGUSR1 takes a device down, SIGUSR2 brings it back.
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, s.p, 2)
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR2); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, s.p, 3)
}

// fakeKubelet serves v1beta1.Registration on a kubelet.sock.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
	srv *grpc.Server
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.got <- r
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, path string, got chan *pluginapi.RegisterRequest) *fakeKubelet {
	t.Helper()
	lis, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	k := &fakeKubelet{got: got, srv: grpc.NewServer()}
	pluginapi.RegisterRegistrationServer(k.srv, k)
	go func() { _ = k.srv.Serve(lis) }()
	t.Cleanup(k.srv.Stop)
	return k
}

func TestKubeletSockModeReRegisters(t *testing.T) {
	root := testutil.TempDir(t)
	dpDir := layout.DevicePluginsDir(root)
	kubeletSock := layout.KubeletSocket(root)
	got := make(chan *pluginapi.RegisterRequest, 10)
	k := startKubelet(t, kubeletSock, got)
	s := runPlugin(t, "--root-dir", root, "--mode", "kubelet-sock", "--resource", "example.com/legacy", "--devices", "2", "--socket-name", "legacy.sock")
	wantRegister := func(what string) {
		t.Helper()
		select {
		case r := <-got:
			if r.Endpoint != "legacy.sock" || r.ResourceName != "example.com/legacy" || r.Version != pluginapi.Version {
				t.Fatalf("%s: Register(%v)", what, r)
			}
		case <-time.After(testutil.Deadline):
			t.Fatalf("%s: no Register", what)
		}
	}
	wantRegister("at start")
	if s.p.SocketPath() != filepath.Join(dpDir, "legacy.sock") {
		t.Fatalf("socket %s", s.p.SocketPath())
	}

	// A kubelet restart: kubelet.sock goes, the plugin sockets are swept,
	// kubelet.sock comes back.
	k.srv.Stop()
	_ = os.Remove(kubeletSock)
	if err := os.Remove(s.p.SocketPath()); err != nil {
		t.Fatal(err)
	}
	startKubelet(t, kubeletSock, got)
	wantRegister("after kubelet.sock was recreated")
	if !unixsock.IsSocket(s.p.SocketPath()) {
		t.Fatal("the plugin did not recreate its socket")
	}
}

func TestBadFlags(t *testing.T) {
	if code := run(context.Background(), []string{"--mode", "sideways", "--root-dir", testutil.TempDir(t)}, io.Discard, nil); code == 0 {
		t.Fatal("an unknown mode was accepted")
	}
	if code := run(context.Background(), []string{"--no-such-flag"}, io.Discard, nil); code != 2 {
		t.Fatalf("unknown flag: exit %d, want 2", code)
	}
	t.Setenv("NODEPLUG_SAMPLEPLUGIN_LOG_FORMAT", "xml")
	if code := run(context.Background(), []string{"--root-dir", testutil.TempDir(t)}, io.Discard, nil); code != 2 {
		t.Fatalf("NODEPLUG_SAMPLEPLUGIN_LOG_FORMAT=xml: exit %d, want 2", code)
	}
}

// --healthcheck with the flags a plugin runs with checks that plugin's
// socket: 0 while it serves, 1 when nothing serves there.
func TestHealthcheck(t *testing.T) {
	root := testutil.TempDir(t)
	args := []string{"--root-dir", root, "--mode", "kubelet-sock", "--resource", "example.com/hc", "--socket-name", "hc.sock"}
	check := func() int {
		return run(context.Background(), append([]string{"--healthcheck"}, args...), io.Discard, nil)
	}
	if code := check(); code != 1 {
		t.Fatalf("healthcheck with no plugin running: exit %d, want 1", code)
	}
	runPlugin(t, args...)
	if code := check(); code != 0 {
		t.Fatalf("healthcheck of the running plugin: exit %d, want 0", code)
	}
	if code := run(context.Background(), []string{"--healthcheck", "--root-dir", root, "--resource", "example.com/other"}, io.Discard, nil); code != 1 {
		t.Fatalf("healthcheck of another plugin's socket: exit %d, want 1", code)
	}
}

// TestInjectedFailures: --prestart-error fails every PreStartContainer with
// its message; POST /failure sets or clears a method's failure; --mount-host-dir
// is where the mounts come from.
func TestInjectedFailures(t *testing.T) {
	root := testutil.TempDir(t)
	s := runPlugin(t, "--root-dir", root, "--resource", "example.com/gpu", "--devices", "2", "--prestart",
		"--prestart-error", "device dev-0 is resetting", "--mount-host-dir", "/srv/devs", "--control-listen", "127.0.0.1:0")
	conn, err := rpcutil.DialPeer(s.p.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	dp := pluginapi.NewDevicePluginClient(conn)
	prestart := func() error {
		_, err := dp.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"dev-0"}})
		return err
	}
	if err := prestart(); status.Code(err) != codes.Internal || status.Convert(err).Message() != "device dev-0 is resetting" {
		t.Fatalf("PreStartContainer with --prestart-error: %v", err)
	}
	post := func(q string, want int) {
		t.Helper()
		resp, err := http.Post("http://"+s.control+"/failure?"+q, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("POST /failure?%s: %d, want %d", q, resp.StatusCode, want)
		}
	}
	post("method=PreStartContainer", http.StatusNoContent)
	if err := prestart(); err != nil {
		t.Fatalf("PreStartContainer after the failure was cleared: %v", err)
	}
	post("method=Allocate&message=out+of+luck", http.StatusNoContent)
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"dev-1"}}}}
	if _, err := dp.Allocate(ctx, req); status.Convert(err).Message() != "out of luck" {
		t.Fatalf("Allocate with an injected failure: %v", err)
	}
	post("method=Allocate&message=", http.StatusNoContent)
	resp, err := dp.Allocate(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if m := resp.GetContainerResponses()[0].GetMounts(); len(m) != 1 || m[0].GetHostPath() != "/srv/devs/dev-1" {
		t.Fatalf("mounts %v, want /srv/devs/dev-1", m)
	}
	post("method=Nope&message=x", http.StatusBadRequest)
}
