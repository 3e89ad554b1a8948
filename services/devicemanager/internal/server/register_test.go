package server

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

func TestRegisterBothPaths(t *testing.T) {
	e := newEnv(t, time.Minute)
	reg := e.plugin("reg", sampleplugin.Options{Resource: "example.com/reg", Devices: 4}, false)
	resp, err := e.register(reg)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetInstanceId() != e.m.InstanceID() || resp.GetInstanceId() == "" {
		t.Fatalf("instance id %q, want %q", resp.GetInstanceId(), e.m.InstanceID())
	}
	r := e.waitCounts("example.com/reg", 4, 4)
	if r.GetFree() != 4 || len(r.GetEndpoints()) != 1 {
		t.Fatalf("resource = %v", r)
	}
	ep := r.GetEndpoints()[0]
	if ep.GetEndpoint() != reg.SocketPath() || ep.GetSocketPath() != reg.SocketPath() || ep.GetGeneration() != testutil.Generation(t, reg.SocketPath()) ||
		ep.GetRegistrationPath() != dmv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY || !ep.GetPrimary() ||
		ep.GetState() != dmv1.EndpointState_ENDPOINT_STATE_LIVE {
		t.Fatalf("endpoint = %v", ep)
	}

	legacy := e.plugin("legacy", sampleplugin.Options{Resource: "example.com/legacy", Devices: 2}, true)
	if err := legacy.Register(ctxT(t), e.kubeletSock()); err != nil {
		t.Fatal(err)
	}
	r = e.waitCounts("example.com/legacy", 2, 2)
	ep = r.GetEndpoints()[0]
	if ep.GetEndpoint() != filepath.Join(e.dpDir, "legacy.sock") || ep.GetRegistrationPath() != dmv1.RegistrationPath_REGISTRATION_PATH_KUBELET_SOCK ||
		ep.GetGeneration() != testutil.Generation(t, legacy.SocketPath()) {
		t.Fatalf("legacy endpoint = %v", ep)
	}
}

func TestRegisterRejects(t *testing.T) {
	e := newEnv(t, time.Minute)
	good := e.plugin("good", sampleplugin.Options{Resource: "example.com/good", Devices: 1}, false)
	outsideDir := testutil.TempDir(t)
	outside, err := sampleplugin.New(sampleplugin.Options{Resource: "example.com/out", Devices: 1, SocketPath: filepath.Join(outsideDir, "out.sock")})
	if err != nil {
		t.Fatal(err)
	}
	if err := outside.Start(); err != nil {
		t.Fatal(err)
	}
	defer outside.Stop()
	escape := filepath.Join(e.regDir, "escape.sock")
	if err := os.Symlink(outside.SocketPath(), escape); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name     string
		req      *dmv1.RegisterPluginRequest
		wantCode codes.Code
		wantMsg  string
	}{
		{"no v1beta1", &dmv1.RegisterPluginRequest{ResourceName: "example.com/good", Endpoint: good.SocketPath(), Versions: []string{"v1alpha"}},
			codes.InvalidArgument, "manager version, v1beta1, is not among plugin supported versions [v1alpha]"},
		{"no domain", &dmv1.RegisterPluginRequest{ResourceName: "good", Endpoint: good.SocketPath(), Versions: []string{"v1beta1"}},
			codes.InvalidArgument, `invalid name of device plugin socket: the ResourceName "good" is invalid`},
		{"kubernetes.io", &dmv1.RegisterPluginRequest{ResourceName: "kubernetes.io/good", Endpoint: good.SocketPath(), Versions: []string{"v1beta1"}},
			codes.InvalidArgument, `the ResourceName "kubernetes.io/good" is invalid`},
		{"outside", &dmv1.RegisterPluginRequest{ResourceName: "example.com/out", Endpoint: outside.SocketPath(), Versions: []string{"v1beta1"}},
			codes.InvalidArgument, "outside the allowed directories"},
		{"dotdot", &dmv1.RegisterPluginRequest{ResourceName: "example.com/good", Endpoint: e.regDir + "/../plugins_registry/good.sock", Versions: []string{"v1beta1"}},
			codes.InvalidArgument, `contains ".."`},
		{"symlink escape", &dmv1.RegisterPluginRequest{ResourceName: "example.com/out", Endpoint: escape, Versions: []string{"v1beta1"}},
			codes.InvalidArgument, "outside the allowed directories"},
		{"relative", &dmv1.RegisterPluginRequest{ResourceName: "example.com/good", Endpoint: "good.sock", Versions: []string{"v1beta1"}},
			codes.InvalidArgument, "not an absolute path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.RegisterPlugin(ctxT(t), tc.req)
			if status.Code(err) != tc.wantCode || !strings.Contains(status.Convert(err).Message(), tc.wantMsg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.wantCode, tc.wantMsg)
			}
		})
	}
	if outside.CallCount(sampleplugin.MethodGetDevicePluginOptions) != 0 {
		t.Fatal("a plugin outside the allowed directories was dialled")
	}

	// The legacy path, with the kubelet's messages and codes.
	conn, err := rpcutil.DialPeer(e.kubeletSock())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	kc := pluginapi.NewRegistrationClient(conn)
	legacy := e.plugin("legacy", sampleplugin.Options{Resource: "example.com/legacy", Devices: 1}, true)
	ltests := []struct {
		name string
		req  *pluginapi.RegisterRequest
		msg  string
	}{
		{"version", &pluginapi.RegisterRequest{Version: "v1alpha", Endpoint: "legacy.sock", ResourceName: "example.com/legacy"},
			`requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]`},
		{"name", &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "legacy.sock", ResourceName: "legacy"},
			`the ResourceName "legacy" is invalid`},
		{"empty name", &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "legacy.sock", ResourceName: ""},
			`the ResourceName "" is invalid`},
		{"path in endpoint", &pluginapi.RegisterRequest{Version: "v1beta1", Endpoint: "../plugins_registry/good.sock", ResourceName: "example.com/legacy"},
			"must be a socket file name"},
	}
	for _, tc := range ltests {
		t.Run("legacy "+tc.name, func(t *testing.T) {
			_, err := kc.Register(ctxT(t), tc.req)
			// The kubelet's Register errors are plain errors: code
			// Unknown, and no name of a code in the text.
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.Unknown || !strings.Contains(msg, tc.msg) || strings.HasSuffix(msg, "invalid argument") {
				t.Fatalf("err = %v, want a plain error (Unknown) containing %q", err, tc.msg)
			}
		})
	}
	if legacy.CallCount(sampleplugin.MethodGetDevicePluginOptions) != 0 {
		t.Fatal("a rejected legacy plugin was dialled")
	}
	resp, err := e.client.ListResources(ctxT(t), &dmv1.ListResourcesRequest{})
	if err != nil || len(resp.GetResources()) != 0 {
		t.Fatalf("resources after rejected registrations: %v, %v", resp, err)
	}
}

func TestGetDevicePluginOptionsFailure(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/opts", Devices: 2}, false)
	p.SetFailure(sampleplugin.MethodGetDevicePluginOptions, status.Error(codes.Internal, "not ready"))
	_, err := e.register(p)
	if c := status.Code(err); (c != codes.Internal && c != codes.Unavailable) || !strings.Contains(err.Error(), "failed to get device plugin options") {
		t.Fatalf("err = %v", err)
	}
	legacy := e.plugin("legacy", sampleplugin.Options{Resource: "example.com/opts-legacy", Devices: 2}, true)
	legacy.SetFailure(sampleplugin.MethodGetDevicePluginOptions, status.Error(codes.Internal, "not ready"))
	if err := legacy.Register(ctxT(t), e.kubeletSock()); err == nil || !strings.Contains(err.Error(), "failed to get device plugin options") {
		t.Fatalf("legacy err = %v", err)
	}
	for _, pl := range []*sampleplugin.Plugin{p, legacy} {
		if n := pl.CallCount(sampleplugin.MethodGetDevicePluginOptions); n != 1 {
			t.Errorf("%s: GetDevicePluginOptions called %d times, want 1", pl.Resource(), n)
		}
		if n := pl.CallCount(sampleplugin.MethodListAndWatch); n != 0 {
			t.Errorf("%s: ListAndWatch called %d times, want 0", pl.Resource(), n)
		}
		if r := e.resource(pl.Resource()); r != nil {
			t.Errorf("resource %s present: %v", pl.Resource(), r)
		}
	}
}

func TestAllocatableFollowsHealth(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/health", Devices: 4}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/health", 4, 4)
	steps := []struct {
		id      string
		healthy bool
		want    int64
	}{
		{"dev-0", false, 3}, {"dev-0", true, 4}, {"dev-1", false, 3}, {"dev-2", false, 2}, {"dev-1", true, 3}, {"dev-2", true, 4},
	}
	for _, s := range steps {
		if err := p.SetHealth(s.id, s.healthy); err != nil {
			t.Fatal(err)
		}
		r := e.waitCounts("example.com/health", s.want, 4)
		if int64(len(r.GetUnhealthyDeviceIds())) != 4-s.want || r.GetFree() != s.want {
			t.Fatalf("after %s=%v: %v", s.id, s.healthy, r)
		}
	}
}

// watchUntilRemoved subscribes to WatchResources and returns a function
// that waits until resource is REMOVED and returns every change of it seen
// after the synced marker.
func watchUntilRemoved(t *testing.T, e *env, resource string) func() []*dmv1.ResourceChange {
	t.Helper()
	ctx, cancel := contextWithCancel(t)
	ws, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if msg.GetSynced() != nil {
			break
		}
	}
	return func() []*dmv1.ResourceChange {
		t.Helper()
		defer cancel()
		var got []*dmv1.ResourceChange
		for {
			msg, err := ws.Recv()
			if err != nil {
				t.Fatalf("watch ended before %s was removed: %v; seen %v", resource, err, got)
			}
			c := msg.GetChange()
			if c.GetResource().GetName() != resource {
				continue
			}
			got = append(got, c)
			if c.GetType() == dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_REMOVED {
				return got
			}
		}
	}
}

// counts renders the changes as allocatable/capacity steps, "removed" last.
func counts(cs []*dmv1.ResourceChange) []string {
	var out []string
	for _, c := range cs {
		s := fmt.Sprintf("%d/%d", c.GetResource().GetAllocatable(), c.GetResource().GetCapacity())
		if c.GetType() == dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_REMOVED {
			s = "removed"
		}
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	return out
}

func TestListAndWatchFails(t *testing.T) {
	t.Run("at once", func(t *testing.T) {
		e := newEnv(t, 300*time.Millisecond)
		p := e.plugin("p", sampleplugin.Options{Resource: "example.com/law", Devices: 2}, false)
		p.SetFailure(sampleplugin.MethodListAndWatch, status.Error(codes.Internal, "broken"))
		wait := watchUntilRemoved(t, e, "example.com/law")
		e.mustRegister(p)
		got := wait()
		if c := counts(got); !slices.Equal(c, []string{"0/0", "removed"}) {
			t.Fatalf("allocatable/capacity went %v, want 0/0 then removed", c)
		}
		if st := got[len(got)-2].GetResource().GetEndpoints()[0].GetState(); st != dmv1.EndpointState_ENDPOINT_STATE_STOPPED {
			t.Fatalf("endpoint state before removal %v", st)
		}
		if p.CallCount(sampleplugin.MethodListAndWatch) != 1 || p.CallCount(sampleplugin.MethodGetDevicePluginOptions) != 1 {
			t.Fatalf("calls = %v; ListAndWatch must not be retried", p.Calls())
		}
	})
	t.Run("after devices", func(t *testing.T) {
		e := newEnv(t, 300*time.Millisecond)
		p := e.plugin("p", sampleplugin.Options{Resource: "example.com/law", Devices: 2}, false)
		wait := watchUntilRemoved(t, e, "example.com/law")
		e.mustRegister(p)
		e.waitCounts("example.com/law", 2, 2)
		p.FailStreams(status.Error(codes.Internal, "broken"))
		got := wait()
		if c := counts(got); !slices.Equal(c, []string{"0/0", "2/2", "0/2", "removed"}) {
			t.Fatalf("allocatable/capacity went %v, want 0/0 (connecting), 2/2, 0/2, removed", c)
		}
		if got[len(got)-2].GetResource().GetGraceDeadline() == nil {
			t.Fatal("no grace deadline on a stopped resource")
		}
		if p.CallCount(sampleplugin.MethodListAndWatch) != 1 {
			t.Fatalf("ListAndWatch called %d times; it must not be retried", p.CallCount(sampleplugin.MethodListAndWatch))
		}
	})
}

func TestPluginStoppedKeepsCapacityForGrace(t *testing.T) {
	e := newEnv(t, 300*time.Millisecond)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/stop", Devices: 2}, false)
	wait := watchUntilRemoved(t, e, "example.com/stop")
	e.mustRegister(p)
	e.waitCounts("example.com/stop", 2, 2)
	p.Stop()
	got := wait()
	if c := counts(got); !slices.Equal(c, []string{"0/0", "2/2", "0/2", "removed"}) {
		t.Fatalf("allocatable/capacity went %v, want 0/0 (connecting), 2/2, 0/2, removed", c)
	}
	stopped := got[len(got)-2].GetResource()
	if ep := stopped.GetEndpoints(); len(ep) != 1 || ep[0].GetState() != dmv1.EndpointState_ENDPOINT_STATE_STOPPED || ep[0].GetStoppedTime() == nil {
		t.Fatalf("endpoints = %v", ep)
	}
	if d := stopped.GetGraceDeadline().AsTime().Sub(stopped.GetEndpoints()[0].GetStoppedTime().AsTime()); d != 300*time.Millisecond {
		t.Fatalf("grace deadline %v after the stop, want 300ms", d)
	}
}

// watchAllocatable records every allocatable value of resource seen through
// WatchResources after the synced marker.
func watchAllocatable(t *testing.T, e *env, resource string) (values func() []int64, stop func()) {
	t.Helper()
	ctx, cancel := contextWithCancel(t)
	ws, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	synced := make(chan struct{})
	ch := make(chan int64, 1024)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(ch)
		isSynced := false
		for {
			msg, err := ws.Recv()
			if err != nil {
				return
			}
			if msg.GetInstanceId() != e.m.InstanceID() {
				t.Errorf("watch item with instance id %q", msg.GetInstanceId())
			}
			if msg.GetSynced() != nil {
				isSynced = true
				close(synced)
				continue
			}
			if c := msg.GetChange(); isSynced && c.GetResource().GetName() == resource {
				v := c.GetResource().GetAllocatable()
				if c.GetType() == dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_REMOVED {
					v = -1
				}
				ch <- v
			}
		}
	}()
	select {
	case <-synced:
	case <-time.After(testutil.Deadline):
		t.Fatal("no synced marker")
	}
	var got []int64
	return func() []int64 {
			cancel()
			<-done
			for v := range ch {
				got = append(got, v)
			}
			return got
		}, func() {
			cancel()
			<-done
		}
}

func TestRollingUpgradeNoDip(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/roll"
	p1 := e.plugin("p1", sampleplugin.Options{Resource: res, Devices: 4}, false)
	e.mustRegister(p1)
	e.waitCounts(res, 4, 4)

	values, _ := watchAllocatable(t, e, res)
	p2 := e.plugin("p2", sampleplugin.Options{Resource: res, Devices: 4}, false)
	e.mustRegister(p2)
	r := e.waitResource(res, "two endpoints, p2 primary", func(r *dmv1.Resource) bool {
		return len(r.GetEndpoints()) == 2 && r.GetEndpoints()[1].GetPrimary() && r.GetEndpoints()[1].GetState() == dmv1.EndpointState_ENDPOINT_STATE_LIVE
	})
	if r.GetEndpoints()[0].GetEndpoint() != p1.SocketPath() {
		t.Fatalf("endpoints = %v", r.GetEndpoints())
	}
	gen1 := testutil.Generation(t, p1.SocketPath())
	p1.Stop()
	e.waitResource(res, "only p2", func(r *dmv1.Resource) bool {
		return len(r.GetEndpoints()) == 1 && r.GetEndpoints()[0].GetEndpoint() == p2.SocketPath() && r.GetEndpoints()[0].GetPrimary()
	})
	if _, err := e.client.DeregisterPlugin(ctxT(t), &dmv1.DeregisterPluginRequest{ResourceName: res, Endpoint: p1.SocketPath(), Generation: gen1}); err != nil {
		t.Fatal(err)
	}
	e.waitCounts(res, 4, 4)
	got := values()
	if len(got) == 0 {
		t.Fatal("no change seen through WatchResources")
	}
	for _, v := range got {
		if v < 4 {
			t.Fatalf("allocatable dipped during the rolling upgrade: %v", got)
		}
	}
}

func TestReRegistration(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/rereg"
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: 3}, false)
	e.mustRegister(p)
	e.waitCounts(res, 3, 3)
	values, _ := watchAllocatable(t, e, res)

	// Same generation: a no-op.
	e.mustRegister(p)
	if n := p.CallCount(sampleplugin.MethodListAndWatch); n != 1 {
		t.Fatalf("same-generation re-registration opened another stream (%d)", n)
	}
	if r := e.resource(res); len(r.GetEndpoints()) != 1 {
		t.Fatalf("endpoints = %v", r.GetEndpoints())
	}

	// New generation of the same endpoint: replaces it, without a dip.
	_, err := e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
		ResourceName: res, Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, SocketPath: p.SocketPath(), Generation: "other-generation",
	})
	if err != nil {
		t.Fatal(err)
	}
	waitCalls(t, p, sampleplugin.MethodListAndWatch, 2)
	r := e.waitResource(res, "the new generation live", func(r *dmv1.Resource) bool {
		return len(r.GetEndpoints()) == 1 && r.GetEndpoints()[0].GetGeneration() == "other-generation" &&
			r.GetEndpoints()[0].GetState() == dmv1.EndpointState_ENDPOINT_STATE_LIVE
	})
	if r.GetAllocatable() != 3 {
		t.Fatalf("resource = %v", r)
	}
	testutil.WaitFor(t, "the replaced stream closed", func() bool { return p.StreamCount() == 1 })
	for _, v := range values() {
		if v != 3 {
			t.Fatalf("allocatable changed during re-registration")
		}
	}

	// The legacy path: a second Register with the same socket is a no-op.
	legacy := e.plugin("legacy", sampleplugin.Options{Resource: "example.com/rereg-legacy", Devices: 2}, true)
	for range 2 {
		if err := legacy.Register(ctxT(t), e.kubeletSock()); err != nil {
			t.Fatal(err)
		}
	}
	e.waitCounts("example.com/rereg-legacy", 2, 2)
	if n := legacy.CallCount(sampleplugin.MethodListAndWatch); n != 1 {
		t.Fatalf("legacy re-Register with the same socket opened %d streams", n)
	}
	// A new socket (the plugin restarted its server) replaces the endpoint.
	oldGen := e.resource("example.com/rereg-legacy").GetEndpoints()[0].GetGeneration()
	legacy.Stop()
	if err := legacy.Start(); err != nil {
		t.Fatal(err)
	}
	if err := legacy.Register(ctxT(t), e.kubeletSock()); err != nil {
		t.Fatal(err)
	}
	e.waitResource("example.com/rereg-legacy", "the new socket live", func(r *dmv1.Resource) bool {
		return len(r.GetEndpoints()) == 1 && r.GetEndpoints()[0].GetGeneration() != oldGen &&
			r.GetEndpoints()[0].GetGeneration() == testutil.Generation(t, legacy.SocketPath()) &&
			r.GetEndpoints()[0].GetState() == dmv1.EndpointState_ENDPOINT_STATE_LIVE && r.GetAllocatable() == 2
	})
}

func TestDeregister(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/dereg"
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: 2}, false)
	e.mustRegister(p)
	e.waitCounts(res, 2, 2)
	resp, err := e.client.DeregisterPlugin(ctxT(t), &dmv1.DeregisterPluginRequest{ResourceName: res, Endpoint: p.SocketPath(), Generation: "stale"})
	if err != nil || resp.GetRemoved() {
		t.Fatalf("deregister with a stale generation: %v, %v", resp, err)
	}
	// An empty generation would match whatever is registered there now.
	resp, err = e.client.DeregisterPlugin(ctxT(t), &dmv1.DeregisterPluginRequest{ResourceName: res, Endpoint: p.SocketPath()})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "generation") {
		t.Fatalf("deregister with no generation: %v, %v; want InvalidArgument", resp, err)
	}
	e.waitCounts(res, 2, 2)
	gen := testutil.Generation(t, p.SocketPath())
	resp, err = e.client.DeregisterPlugin(ctxT(t), &dmv1.DeregisterPluginRequest{ResourceName: res, Endpoint: p.SocketPath(), Generation: gen})
	if err != nil || !resp.GetRemoved() || resp.GetInstanceId() != e.m.InstanceID() {
		t.Fatalf("deregister: %v, %v", resp, err)
	}
	e.waitCounts(res, 0, 2)
	resp, err = e.client.DeregisterPlugin(ctxT(t), &dmv1.DeregisterPluginRequest{ResourceName: res, Endpoint: p.SocketPath(), Generation: gen})
	if err != nil || resp.GetRemoved() {
		t.Fatalf("second deregister: %v, %v", resp, err)
	}
}

// TestWatchResourcesOmitDeviceIDs: a subscriber that asks for it gets the
// counts and endpoints without the device ID lists.
func TestWatchResourcesOmitDeviceIDs(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/omit", Devices: 3}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/omit", 3, 3)
	ctx, cancel := contextWithCancel(t)
	defer cancel()
	st, err := e.client.WatchResources(ctx, &dmv1.WatchResourcesRequest{OmitDeviceIds: true})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	r := resp.GetChange().GetResource()
	if r.GetName() != "example.com/omit" || r.GetCapacity() != 3 || r.GetAllocatable() != 3 || len(r.GetEndpoints()) != 1 {
		t.Fatalf("snapshot item = %v", r)
	}
	if len(r.GetHealthyDeviceIds())+len(r.GetUnhealthyDeviceIds())+len(r.GetAllocatedDeviceIds()) != 0 {
		t.Fatalf("device IDs sent although omitted: %v", r)
	}
	if full := e.resource("example.com/omit"); len(full.GetHealthyDeviceIds()) != 3 {
		t.Fatalf("ListResources lost the device IDs: %v", full)
	}
}
