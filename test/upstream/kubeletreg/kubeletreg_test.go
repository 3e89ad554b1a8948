package kubeletreg

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
)

// harnessEnv, set, makes the test binary kubeletreg itself (TestMain), so
// that the test runs the harness as a process of its own, in a mount
// namespace of its own, without building it.
const harnessEnv = "KUBELETREG_TEST_HARNESS"

func TestMain(m *testing.M) {
	if os.Getenv(harnessEnv) != "" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestKubeletregRegistersADeviceAndADRAPlugin runs the harness on a
// plugins_registry directory, a device plugin (the one nodeplug-bench
// measures) and a DRA driver of the upstream kubeletplugin helper appear
// there, and each is told NotifyRegistrationStatus(true) by the kubelet's
// plugin manager. The harness reports the device manager's first
// ListAndWatch update, and both deregistrations once the plugins go.
func TestKubeletregRegistersADeviceAndADRAPlugin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("kubeletreg needs root: it bind-mounts a directory over /var/lib/kubelet in a mount namespace of its own")
	}
	dir := testutil.TempDir(t) // short: socket paths live in it
	reg := filepath.Join(dir, "plugins_registry")
	h := startHarness(t, reg, filepath.Join(dir, "kubelet"))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The device plugin listens beside the directory and appears in it by
	// a rename, as in the bench.
	const resource = "kubeletreg.example.com/dev"
	staged, dpSock := filepath.Join(dir, "dp.sock"), filepath.Join(reg, "dp.sock")
	dp, err := sampleplugin.New(sampleplugin.Options{Resource: resource, SocketPath: staged, Endpoint: dpSock, Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := dp.Start(); err != nil {
		t.Fatal(err)
	}
	defer dp.Stop()
	if err := os.Rename(staged, dpSock); err != nil {
		t.Fatal(err)
	}

	draSock := filepath.Join(dir, "dra", "dra.sock")
	if err := os.MkdirAll(filepath.Dir(draSock), 0o750); err != nil {
		t.Fatal(err)
	}
	observe, notified := notifications()
	drv, err := kubeletplugin.Start(ctx, nopDriver{t}, kubeletplugin.DriverName("kubeletreg.example.com"), kubeletplugin.GRPCInterceptor(observe),
		kubeletplugin.KubeClient(fake.NewClientset()), kubeletplugin.NodeName("kubeletreg"),
		kubeletplugin.RegistrarDirectoryPath(reg), kubeletplugin.PluginDataDirectoryPath(filepath.Dir(draSock)))
	if err != nil {
		t.Fatal(err)
	}
	defer drv.Stop()

	if st, err := dp.WaitStatus(ctx, testplugin.Registered); err != nil {
		t.Fatalf("the device plugin: %v", err)
	} else if !st.Registered || st.Error != "" {
		t.Fatalf("the device plugin was told %+v", st)
	}
	select {
	case st := <-notified:
		if !st.GetPluginRegistered() {
			t.Fatalf("the DRA driver was told %v", st)
		}
	case <-ctx.Done():
		t.Fatal("the DRA driver was never told its registration status")
	}
	h.await(t, "devices "+resource)

	// Both go (the device plugin's socket, moved, is not its to remove).
	if err := os.Remove(dpSock); err != nil {
		t.Fatal(err)
	}
	dp.Stop()
	drv.Stop()
	h.await(t, "deregistered "+dpSock, "deregistered "+draSock)
}

// notifications returns a gRPC interceptor for a DRA driver's servers and
// the channel on which it passes each NotifyRegistrationStatus the driver
// received. (The helper's RegistrationStatus cannot be polled: it reads
// what its server writes without synchronization.)
func notifications() (grpc.UnaryServerInterceptor, <-chan *registerapi.RegistrationStatus) {
	ch := make(chan *registerapi.RegistrationStatus, 8)
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if st, ok := req.(*registerapi.RegistrationStatus); ok {
			select {
			case ch <- st:
			default:
			}
		}
		return resp, err
	}, ch
}

// harness is a running kubeletreg and the lines it wrote.
type harness struct {
	lines <-chan string
	seen  map[string]bool
}

// startHarness starts the test binary as kubeletreg on dir, with root as
// its /var/lib/kubelet, and waits until it is ready. It is stopped with
// SIGTERM when t ends, and must end well.
func startHarness(t *testing.T, dir, root string) *harness {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-dir", dir, "-kubelet-root", root)
	cmd.Env = append(os.Environ(), harnessEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	stderr := &lockedBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Buffered beyond the few lines of a test: the reader never blocks, so
	// Wait is not held up by an unread pipe.
	lines := make(chan string, 128)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("kubeletreg: %v\n%s", err, stderr)
		} else if t.Failed() {
			t.Logf("kubeletreg's errors:\n%s", stderr)
		}
	})
	h := &harness{lines: lines, seen: map[string]bool{}}
	h.await(t, "ready")
	return h
}

// await returns once every line of want was written, in any order.
func (h *harness) await(t *testing.T, want ...string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for _, w := range want {
		for !h.seen[w] {
			select {
			case l, ok := <-h.lines:
				if !ok {
					t.Fatalf("kubeletreg ended before writing %q", w)
				}
				h.seen[l] = true
			case <-timeout:
				t.Fatalf("kubeletreg did not write %q (it wrote %v)", w, h.seen)
			}
		}
	}
}

// nopDriver is a DRA driver that registers and is asked for nothing.
type nopDriver struct{ t *testing.T }

func (nopDriver) PrepareResourceClaims(context.Context, []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	return nil, nil
}

func (nopDriver) UnprepareResourceClaims(context.Context, []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return nil, nil
}

// WatchHealthStatus: the driver reports no health (the harness, as a
// kubelet without a health stream handler, would not ask).
func (nopDriver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (d nopDriver) HandleError(_ context.Context, err error, msg string) {
	d.t.Errorf("DRA driver: %s: %v", msg, err)
}

// lockedBuffer is a bytes.Buffer written by exec's copying goroutine and
// read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
