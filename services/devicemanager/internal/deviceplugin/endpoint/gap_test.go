package endpoint

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
)

// onePlugin is the least device plugin: no options, one device.
type onePlugin struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (onePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (onePlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: "d", Health: pluginapi.Healthy}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// boundSocket binds a Unix socket at path without listening: connections
// to it are refused until listen is called, which serves srv on it.
func boundSocket(t *testing.T, path string, srv *grpc.Server) (listen func()) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		_ = syscall.Close(fd)
		t.Fatal(err)
	}
	return func() {
		if err := syscall.Listen(fd, 16); err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), path)
		lis, err := net.FileListener(f)
		_ = f.Close()
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(lis) }()
	}
}

// TestConnectThroughBindListenGap: a socket file that exists but refuses
// connections (bound, not yet listening) is retried through that gap, so a
// plugin that listens a little after it bound connects.
func TestConnectThroughBindListenGap(t *testing.T) {
	old := RefusedRetry
	RefusedRetry = testutil.Deadline // the gap may be as long as the test needs
	t.Cleanup(func() { RefusedRetry = old })
	path := filepath.Join(testutil.TempDir(t), "gap.sock")
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, onePlugin{})
	t.Cleanup(srv.Stop)
	listen := boundSocket(t, path, srv)

	type result struct {
		c   *Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := Connect(ctxT(t), "example.com/gap", path, dialer(path))
		done <- result{c, err}
	}()
	// The scenario's gap between bind() and listen(), not a
	// synchronisation: Connect tries at once and is refused meanwhile.
	<-time.After(100 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("Connect ended while the socket refused: %v", r.err)
	default:
	}
	listen()
	r := <-done
	if r.err != nil {
		t.Fatalf("Connect through the bind→listen gap: %v", r.err)
	}
	got := make(chan []Device, 1)
	go func() { _ = r.c.Run(func(d []Device) { got <- d }) }()
	if d := <-got; len(d) != 1 || d[0].ID != "d" {
		t.Fatalf("first update = %v", d)
	}
	r.c.Close(nil)
}

// TestConnectRefusedFails: a socket nothing listens on fails after the
// short gap, with the kubelet's message, not after the kubelet's 10 s.
func TestConnectRefusedFails(t *testing.T) {
	path := filepath.Join(testutil.TempDir(t), "dead.sock")
	srv := grpc.NewServer()
	t.Cleanup(srv.Stop)
	_ = boundSocket(t, path, srv) // never listens
	_, err := Connect(ctxT(t), "example.com/dead", path, dialer(path))
	if msg, ok := kubeletrules.Message(err); err == nil || !ok || msg == "" {
		t.Fatalf("Connect to a socket nothing listens on: %v", err)
	}
}
