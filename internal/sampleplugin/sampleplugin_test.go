package sampleplugin

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func startPlugin(t *testing.T, opts Options) *Plugin {
	t.Helper()
	if opts.SocketPath == "" {
		opts.SocketPath = filepath.Join(testutil.TempDir(t), "p.sock")
	}
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

func healthyIDs(devs []*pluginapi.Device) []string {
	var out []string
	for _, d := range devs {
		if d.Health == pluginapi.Healthy {
			out = append(out, d.ID)
		}
	}
	return out
}

func TestPluginServesBothServices(t *testing.T) {
	p := startPlugin(t, Options{Resource: "example.com/dev", Devices: 3, Preferred: true, PreStartRequired: true, CDI: true})
	conn, err := rpcutil.DialPeer(p.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.DevicePlugin || info.Name != "example.com/dev" || info.Endpoint != p.SocketPath() || !slices.Equal(info.SupportedVersions, []string{"v1beta1"}) {
		t.Fatalf("GetInfo = %v", info)
	}
	dp := pluginapi.NewDevicePluginClient(conn)
	opts, err := dp.GetDevicePluginOptions(ctx, &pluginapi.Empty{})
	if err != nil || !opts.PreStartRequired || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("options = %v, %v", opts, err)
	}
	stream, err := dp.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := healthyIDs(first.Devices); !slices.Equal(got, []string{"dev-0", "dev-1", "dev-2"}) {
		t.Fatalf("first list healthy = %v", got)
	}
	if err := p.SetHealth("dev-1", false); err != nil {
		t.Fatal(err)
	}
	second, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := healthyIDs(second.Devices); !slices.Equal(got, []string{"dev-0", "dev-2"}) {
		t.Fatalf("after SetHealth healthy = %v", got)
	}
	if err := p.SetHealth("nope", false); err == nil {
		t.Fatal("SetHealth of an unknown device succeeded")
	}

	pref, err := dp.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
		AvailableDeviceIDs: []string{"dev-0", "dev-1", "dev-2"}, MustIncludeDeviceIDs: []string{"dev-0"}, AllocationSize: 2,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := pref.ContainerResponses[0].DeviceIDs; !slices.Equal(got, []string{"dev-0", "dev-2"}) {
		t.Fatalf("preferred = %v", got)
	}
	alloc, err := dp.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"dev-0"}}}})
	if err != nil {
		t.Fatal(err)
	}
	cr := alloc.ContainerResponses[0]
	if cr.Envs["NODEPLUG_DEVICES"] != "dev-0" || len(cr.Mounts) != 1 || len(cr.Devices) != 1 || len(cr.CdiDevices) != 1 || cr.CdiDevices[0].Name != "example.com/dev=dev-0" {
		t.Fatalf("allocate response = %v", cr)
	}
	if _, err := dp.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"dev-1"}}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Allocate of an unhealthy device: %v", err)
	}
	if _, err := dp.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: []string{"dev-0"}}); err != nil {
		t.Fatal(err)
	}
	if p.CallCount(MethodPreStartContainer) != 1 || p.CallCount(MethodListAndWatch) != 1 {
		t.Fatalf("calls = %v", p.Calls())
	}

	p.FailStreams(status.Error(codes.Internal, "boom"))
	if _, err := stream.Recv(); status.Code(err) != codes.Internal {
		t.Fatalf("stream after FailStreams: %v", err)
	}
	p.SetFailure(MethodGetDevicePluginOptions, status.Error(codes.Unavailable, "not yet"))
	if _, err := dp.GetDevicePluginOptions(ctx, &pluginapi.Empty{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("injected failure: %v", err)
	}
	if _, err := registerapi.NewRegistrationClient(conn).NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	if st, err := p.WaitStatus(ctx, testplugin.Registered); err != nil || len(p.Statuses()) != 1 {
		t.Fatalf("WaitStatus = %+v, %v; statuses %v", st, err, p.Statuses())
	}
	// The registration knobs are the embedded Registration's.
	p.SetGetInfoError(status.Error(codes.Unavailable, "not ready"))
	if _, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("GetInfo with an injected failure: %v", err)
	}
	if n := p.GetInfoCalls(); n != 2 {
		t.Fatalf("GetInfo calls %d, want 2", n)
	}
}

// fakeKubelet records v1beta1 Register calls.
type fakeKubelet struct {
	pluginapi.UnimplementedRegistrationServer
	got chan *pluginapi.RegisterRequest
}

func (k *fakeKubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.got <- r
	return &pluginapi.Empty{}, nil
}

func TestPluginRegisterOnKubeletSock(t *testing.T) {
	dir := testutil.TempDir(t)
	kubelet := &fakeKubelet{got: make(chan *pluginapi.RegisterRequest, 1)}
	ks, _ := rpcutil.NewServer(discardLogger())
	pluginapi.RegisterRegistrationServer(ks, kubelet)
	lis, err := unixsock.Listen(filepath.Join(dir, layout.KubeletSocketName))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ks.Serve(lis) }()
	defer ks.Stop()

	p := startPlugin(t, Options{Resource: "example.com/dev", Devices: 1, SocketPath: filepath.Join(dir, "dp.sock")})
	if err := p.Register(context.Background(), filepath.Join(dir, layout.KubeletSocketName)); err != nil {
		t.Fatal(err)
	}
	r := <-kubelet.got
	if r.Endpoint != "dp.sock" || r.ResourceName != "example.com/dev" || r.Version != "v1beta1" {
		t.Fatalf("register request = %v", r)
	}
	if err := p.Register(context.Background(), "/elsewhere/kubelet.sock"); err == nil {
		t.Fatal("Register from another directory succeeded")
	}
	p.Stop()
	if _, err := os.Stat(p.SocketPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after Stop: %v", err)
	}
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestMountHostDir: the default response mounts each device from
// <MountHostDir>/<id>, /tmp/<id> when it is not set.
func TestMountHostDir(t *testing.T) {
	for _, tc := range []struct{ dir, want string }{{"", "/tmp/dev-1"}, {"/srv/devs", "/srv/devs/dev-1"}} {
		p := startPlugin(t, Options{Resource: "example.com/dev", Devices: 2, MountHostDir: tc.dir})
		conn, err := rpcutil.DialPeer(p.SocketPath())
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
		resp, err := pluginapi.NewDevicePluginClient(conn).Allocate(ctx, &pluginapi.AllocateRequest{
			ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"dev-1"}}},
		})
		cancel()
		_ = conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		m := resp.GetContainerResponses()[0].GetMounts()
		if len(m) != 1 || m[0].GetHostPath() != tc.want || m[0].GetContainerPath() != "/dev/nodeplug/dev-1" || !m[0].GetReadOnly() {
			t.Fatalf("MountHostDir %q: mounts %v, want %s on /dev/nodeplug/dev-1, read-only", tc.dir, m, tc.want)
		}
	}
}
