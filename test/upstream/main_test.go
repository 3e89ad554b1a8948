package upstream

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// binDir holds the service binaries built by TestMain.
var binDir string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "nodeplug-upstream-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := stack.Build(ctx, dir, "nodeplug-apiserver", "nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager", "nodeplug-dramanager", "nodeplugctl"); err != nil {
		fmt.Fprintln(os.Stderr, "build the services:", err)
		return 1
	}
	// The DRA driver is a program of this module (cmd/dradriver).
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "dradriver"), "./cmd/dradriver")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build the DRA driver: %v\n%s", err, out)
		return 1
	}
	binDir = dir
	return m.Run()
}

// startStack starts the four services over a new root dir, stopped (and
// their logs shown on failure) when t ends, and returns the root dir, a
// context that bounds the test, and a client connection to service.
func startStack(t *testing.T, timeout time.Duration, service string) (root string, ctx context.Context, conn *grpc.ClientConn) {
	t.Helper()
	root = testutil.TempDir(t)
	st := stack.NewProcesses(binDir, root)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	t.Cleanup(func() {
		st.StopAll()
		if t.Failed() {
			for _, s := range stack.Services {
				if p := st.Process(s); p != nil {
					t.Logf("%s log:\n%s", s, p.Logs())
				}
			}
		}
	})
	if err := st.StartAll(ctx); err != nil {
		t.Fatal(err)
	}
	conn, err := rpcutil.DialPeer(st.Addr(service))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return root, ctx, conn
}

// dm is a running nodeplug-devicemanager over its own root dir.
type dm struct {
	t      *testing.T
	root   string
	dpDir  string
	procs  *stack.Processes
	conn   *grpc.ClientConn
	client dmv1.DeviceManagerServiceClient
}

// startDM starts a devicemanager over a new root dir, with the dramanager
// it asks for the claims of a container start and of the pod resources
// API (there are none: no DRA driver runs).
func startDM(t *testing.T) *dm {
	t.Helper()
	root := testutil.TempDir(t)
	d := &dm{t: t, root: root, dpDir: filepath.Join(root, "device-plugins"), procs: stack.NewProcesses(binDir, root)}
	t.Cleanup(func() {
		if d.conn != nil {
			_ = d.conn.Close()
		}
		for _, name := range []string{"devicemanager", "dramanager"} {
			if p := d.procs.Process(name); t.Failed() && p != nil {
				t.Logf("%s log:\n%s", name, p.Logs())
			}
			d.procs.Kill(name)
		}
	})
	if err := d.procs.Start(ctxT(t), "dramanager"); err != nil {
		t.Fatal(err)
	}
	d.start()
	return d
}

// start starts the devicemanager (again, on the same address) and connects
// to its API.
func (d *dm) start() {
	d.t.Helper()
	if err := d.procs.Start(ctxT(d.t), "devicemanager"); err != nil {
		d.t.Fatal(err)
	}
	if d.conn != nil {
		_ = d.conn.Close()
	}
	conn, err := rpcutil.DialPeer(d.procs.Addr("devicemanager"))
	if err != nil {
		d.t.Fatal(err)
	}
	d.conn, d.client = conn, dmv1.NewDeviceManagerServiceClient(conn)
}

// kill SIGKILLs the devicemanager.
func (d *dm) kill() { d.procs.Kill("devicemanager") }

func (d *dm) kubeletSock() string {
	return filepath.Join(d.dpDir, filepath.Base(pluginapi.KubeletSocket))
}

// resource returns the named resource, nil when absent.
func (d *dm) resource(name string) *dmv1.Resource {
	d.t.Helper()
	resp, err := d.client.ListResources(ctxT(d.t), &dmv1.ListResourcesRequest{})
	if err != nil {
		d.t.Fatalf("ListResources: %v", err)
	}
	for _, r := range resp.GetResources() {
		if r.GetName() == name {
			return r
		}
	}
	return nil
}

// waitLive waits until the named resource has allocatable devices and one
// live endpoint for which cond holds, and returns it.
func (d *dm) waitLive(name string, allocatable int64, cond func(*dmv1.Endpoint) bool) *dmv1.Resource {
	d.t.Helper()
	var r *dmv1.Resource
	testutil.Eventually(d.t, name+" live", func() error {
		r = d.resource(name)
		if r.GetAllocatable() != allocatable || len(r.GetEndpoints()) != 1 {
			return fmt.Errorf("last: %v", r)
		}
		ep := r.GetEndpoints()[0]
		if ep.GetState() != dmv1.EndpointState_ENDPOINT_STATE_LIVE || (cond != nil && !cond(ep)) {
			return fmt.Errorf("last: %v", r)
		}
		return nil
	})
	return r
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	t.Cleanup(cancel)
	return ctx
}

// logger is the Stub's logger: klog's, as the kubelet's tests use.
func logger() klog.Logger { return klog.Background() }

func devices(ids ...string) []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(ids))
	for _, id := range ids {
		out = append(out, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	return out
}

// echoAlloc answers Allocate with one container response per request,
// naming its devices in an env variable (the Stub's default answers none,
// which the kubelet refuses too).
func echoAlloc(r *pluginapi.AllocateRequest, _ map[string]*pluginapi.Device) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range r.GetContainerRequests() {
		ids := slices.Clone(cr.GetDevicesIds())
		slices.Sort(ids)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"STUB_DEVICES": fmt.Sprint(ids)},
		})
	}
	return resp, nil
}

// newStub returns a started Stub serving resource with the device IDs on
// <device-plugins>/<name>.sock. Set its functions before it starts: pass
// them in setup.
func (d *dm) newStub(name, resource string, preferred bool, ids []string, setup func(*plugin.Stub)) *plugin.Stub {
	d.t.Helper()
	s := plugin.NewDevicePluginStub(logger(), devices(ids...), filepath.Join(d.dpDir, name+".sock"), resource, false, preferred)
	s.SetAllocFunc(echoAlloc)
	if setup != nil {
		setup(s)
	}
	if err := s.Start(klog.NewContext(context.Background(), logger())); err != nil {
		d.t.Fatalf("Stub Start: %v", err)
	}
	return s
}
