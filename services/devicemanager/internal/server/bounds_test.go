package server

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// maxErr is the longest error message a bad value may cause: the value
// echoed cut to bounds.MaxEcho bytes (escaped by %q at worst four bytes a
// byte), plus the words around it.
const maxErr = 4*bounds.MaxEcho + 300

// TestBoundsOnEveryRequest: names, endpoints, pod UIDs, container names
// and device IDs out of bounds, by size or by character, are
// InvalidArgument on every API and by both registration paths, with a
// short error; no plugin is called.
func TestBoundsOnEveryRequest(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/b", Devices: 2}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/b", 2, 2)
	huge := strings.Repeat("x", 100<<10)
	conn, err := rpcutil.DialPeer(e.kubeletSock())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	kc := pluginapi.NewRegistrationClient(conn)
	legacy := func(resource, endpoint, version string) func() error {
		return func() error {
			_, err := kc.Register(ctxT(t), &pluginapi.RegisterRequest{Version: version, Endpoint: endpoint, ResourceName: resource})
			return err
		}
	}
	registerPlugin := func(resource, endpoint, generation string, versions ...string) func() error {
		return func() error {
			_, err := e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
				ResourceName: resource, Endpoint: endpoint, Versions: versions, SocketPath: endpoint, Generation: generation,
			})
			return err
		}
	}
	allocate := func(req *dmv1.AllocateRequest) func() error {
		return func() error { _, err := e.client.Allocate(ctxT(t), req); return err }
	}
	release := func(pod, container string) func() error {
		return func() error {
			_, err := e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: pod, ContainerName: container})
			return err
		}
	}
	deregister := func(resource, endpoint, generation string) func() error {
		return func() error {
			_, err := e.client.DeregisterPlugin(ctxT(t), &dmv1.DeregisterPluginRequest{ResourceName: resource, Endpoint: endpoint, Generation: generation})
			return err
		}
	}
	v1 := pluginapi.Version
	ep := p.SocketPath()
	tests := []struct {
		name string
		call func() error
		msg  string
	}{
		{"RegisterPlugin huge name", registerPlugin("example.com/"+huge, ep, "g", v1), "resource name"},
		{"RegisterPlugin name with NUL", registerPlugin("example.com/a\x00b", ep, "g", v1), "unprintable"},
		{"RegisterPlugin huge endpoint", registerPlugin("example.com/b", "/"+huge, "g", v1), "longer than the 107 bytes"},
		{"RegisterPlugin huge generation", registerPlugin("example.com/b", ep, huge, v1), "generation"},
		{"RegisterPlugin huge version", registerPlugin("example.com/b", ep, "g", huge), "version"},
		{"legacy huge name", legacy("example.com/"+huge, "p.sock", v1), "resource name"},
		{"legacy huge endpoint", legacy("example.com/b", huge, v1), "longer than the 107 bytes"},
		{"legacy endpoint with NUL", legacy("example.com/b", "p\x00.sock", v1), "socket file name"},
		{"legacy endpoint with newline", legacy("example.com/b", "p\n.sock", v1), "unprintable"},
		{"legacy huge version", legacy("example.com/b", "p.sock", huge), "version"},
		{"Allocate huge pod", allocate(allocReq(huge, "c", "example.com/b", 1)), "pod UID"},
		{"Allocate pod with NUL", allocate(allocReq("pod\x00", "c", "example.com/b", 1)), "pod UID"},
		{"Allocate pod with newline", allocate(allocReq("pod\nx", "c", "example.com/b", 1)), "pod UID"},
		{"Allocate huge container", allocate(allocReq("pod", huge, "example.com/b", 1)), "container name"},
		{"Allocate container with newline", allocate(allocReq("pod", "c\n", "example.com/b", 1)), "container name"},
		{"Allocate huge resource", allocate(allocReq("pod", "c", "example.com/"+huge, 1)), "resource name"},
		{"Allocate huge must-include", allocate(allocReq("pod", "c", "example.com/b", 1, huge)), "device ID"},
		{"Allocate must-include with NUL", allocate(allocReq("pod", "c", "example.com/b", 1, "dev-0\x00")), "device ID"},
		{"Release huge pod", release(huge, ""), "pod UID"},
		{"Release pod with NUL", release("pod\x00", ""), "pod UID"},
		{"Release huge container", release("pod", huge), "container name"},
		{"Deregister huge name", deregister("example.com/"+huge, ep, "g"), "resource name"},
		{"Deregister huge endpoint", deregister("example.com/b", "/"+huge, "g"), "endpoint"},
		{"Deregister huge generation", deregister("example.com/b", ep, huge), "generation"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			msg := status.Convert(err).Message()
			// A legacy Register fails as the kubelet's does: a plain
			// error (code Unknown).
			want := codes.InvalidArgument
			if strings.HasPrefix(tc.name, "legacy ") {
				want = codes.Unknown
			}
			if status.Code(err) != want || !strings.Contains(msg, tc.msg) {
				t.Fatalf("%.300v; want %v containing %q", err, want, tc.msg)
			}
			if len(msg) > maxErr {
				t.Fatalf("error of %d bytes: %.300s…", len(msg), msg)
			}
		})
	}
	for _, m := range []string{sampleplugin.MethodAllocate, sampleplugin.MethodGetPreferredAllocation} {
		if n := p.CallCount(m); n != 0 {
			t.Errorf("%s called %d times", m, n)
		}
	}
	if n := p.CallCount(sampleplugin.MethodListAndWatch); n != 1 {
		t.Errorf("ListAndWatch opened %d times", n)
	}
	if r := e.waitCounts("example.com/b", 2, 2); r.GetFree() != 2 || len(r.GetEndpoints()) != 1 {
		t.Fatalf("resource after refused requests: %v", r)
	}
}

// TestInvalidDeviceIDsDropped: a device whose ID is out of bounds (too
// long, a newline, a NUL) is dropped from a plugin's update with a
// warning; the plugin's other devices are used.
func TestInvalidDeviceIDsDropped(t *testing.T) {
	e := newEnv(t, time.Minute)
	good := []string{"dev-0", strings.Repeat("d", bounds.MaxDeviceID)}
	bad := []string{strings.Repeat("d", bounds.MaxDeviceID+1), "dev\n1", "dev\x002"}
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/ids", DeviceIDs: append(append([]string(nil), good...), bad...)}, false)
	e.mustRegister(p)
	r := e.waitCounts("example.com/ids", 2, 2)
	for _, id := range r.GetHealthyDeviceIds() {
		if id != good[0] && id != good[1] {
			t.Fatalf("device %q kept", id)
		}
	}
	if !e.logs.has("device plugin sent invalid device IDs; those devices are ignored", "resource", "example.com/ids", "dropped", "3") {
		t.Fatalf("no warning:\n%s", e.logs.String())
	}
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", "example.com/ids", 2)); err != nil {
		t.Fatal(err)
	}
	if calls := p.Calls(); calls[len(calls)-1].Method != sampleplugin.MethodAllocate || len(calls[len(calls)-1].DeviceIDs) != 2 {
		t.Fatalf("plugin calls: %v", calls)
	}
}

// TestMetricLabelsOnlyForRegisteredResources: an Allocate for a resource
// nobody registered, and registrations that are refused (invalid, outside
// the allowed directories, a plugin that does not answer), leave no metric
// series behind; the registered resource has its series.
func TestMetricLabelsOnlyForRegisteredResources(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/known", Devices: 1}, true)
	if err := p.Register(ctxT(t), e.kubeletSock()); err != nil {
		t.Fatal(err)
	}
	e.waitCounts("example.com/known", 1, 1)

	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", "example.com/unknown-allocate", 1)); status.Code(err) != codes.NotFound {
		t.Fatalf("Allocate of an unknown resource: %v", err)
	}
	if _, err := e.client.Allocate(ctxT(t), &dmv1.AllocateRequest{PodUid: "pod", ContainerName: "c", Resources: []*dmv1.ResourceRequest{
		{ResourceName: "example.com/known", Count: 1}, {ResourceName: "example.com/unknown-with-known", Count: 1},
	}}); status.Code(err) != codes.NotFound {
		t.Fatalf("Allocate of a known and an unknown resource: %v", err)
	}
	refused := []*dmv1.RegisterPluginRequest{
		{ResourceName: "unknown-invalid", Endpoint: p.SocketPath(), Versions: []string{pluginapi.Version}, Generation: "g"},
		{ResourceName: "example.com/unknown-version", Endpoint: p.SocketPath(), Versions: []string{"v0"}, Generation: "g"},
		{ResourceName: "example.com/unknown-outside", Endpoint: "/nonexistent/x.sock", Versions: []string{pluginapi.Version}, Generation: "g"},
		{ResourceName: "example.com/unknown-taken", Endpoint: p.SocketPath(), Versions: []string{pluginapi.Version}, Generation: "g"},
	}
	for _, req := range refused {
		if _, err := e.client.RegisterPlugin(ctxT(t), req); err == nil {
			t.Fatalf("RegisterPlugin %v succeeded", req)
		}
	}
	dead := e.plugin("dead", sampleplugin.Options{Resource: "example.com/unknown-dead", Devices: 1}, false)
	dead.SetFailure(sampleplugin.MethodGetDevicePluginOptions, status.Error(codes.Unavailable, "not yet"))
	if _, err := e.register(dead); err == nil {
		t.Fatal("a plugin that fails GetDevicePluginOptions registered")
	}
	if _, err := pluginapi.NewRegistrationClient(mustDial(t, e.kubeletSock())).Register(ctxT(t), &pluginapi.RegisterRequest{
		Version: "v0", Endpoint: "p.sock", ResourceName: "example.com/unknown-legacy",
	}); err == nil {
		t.Fatal("legacy Register with a bad version succeeded")
	}

	mfs, err := e.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	known := 0
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() != "resource_name" {
					continue
				}
				if lp.GetValue() != "example.com/known" {
					t.Errorf("%s has a series for %q", mf.GetName(), lp.GetValue())
				}
				known++
			}
		}
	}
	if known == 0 {
		t.Fatal("no series for the registered resource")
	}
	if got := metricValue(t, e, "kubelet_device_plugin_registration_total", map[string]string{"resource_name": "example.com/known"}); got != 1 {
		t.Fatalf("registrations of the known resource = %v, want 1", got)
	}
	if got := metricValue(t, e, "nodeplug_devicemanager_allocations_total", map[string]string{"resource_name": "example.com/known", "result": "failed"}); got != 1 {
		t.Fatalf("failed allocations of the known resource = %v, want 1", got)
	}
}

func mustDial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	c, err := rpcutil.DialPeer(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
