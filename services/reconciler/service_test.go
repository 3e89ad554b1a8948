package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodeplug/nodeplug/internal/testutil"
	devicemanagerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/handler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/reconciler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

func csiOptions(name string) testplugin.Options {
	return testplugin.Options{Register: func(s *grpc.Server) {
		f := &fakeCSI{name: name}
		csi.RegisterIdentityServer(s, f)
		csi.RegisterNodeServer(s, f)
	}}
}

// The kubelet's behaviour: a plugin registers when its socket appears and
// is deregistered when it goes, for every plugin type.
func TestRegistrationAndDeregistration(t *testing.T) {
	for _, tc := range []struct {
		name       string
		info       testplugin.Info
		opts       []testplugin.Options
		registered func(t *testing.T, e *env, path string)
		gone       func(t *testing.T, e *env, path string)
	}{
		{
			name: "DevicePlugin",
			info: devicePlugin("example.com/gpu"),
			registered: func(t *testing.T, e *env, path string) {
				ep, ok := e.dm.Endpoints()[path]
				if !ok || ep.resource != "example.com/gpu" || ep.socketPath != path || ep.generation != testutil.Generation(t, path) {
					t.Fatalf("devicemanager endpoints = %+v, want %s registered with its generation", e.dm.Endpoints(), path)
				}
			},
			gone: func(t *testing.T, e *env, path string) {
				testutil.WaitFor(t, "devicemanager endpoint removed", func() bool { return len(e.dm.Endpoints()) == 0 })
			},
		},
		{
			name: "DRAPlugin",
			info: draPlugin("dra.example.com"),
			registered: func(t *testing.T, e *env, path string) {
				d := e.s.drivers.List(handler.TypeDRAPlugin)
				if len(d) != 1 || d[0].Name != "dra.example.com" || d[0].Endpoint != path || d[0].SocketPath != path {
					t.Fatalf("DRA drivers = %+v", d)
				}
				in, ok := e.dm.DRAInstances()[path]
				if !ok || in.driver != "dra.example.com" || in.socketPath != path || in.generation != testutil.Generation(t, path) {
					t.Fatalf("devicemanager DRA instances = %+v, want %s registered with its generation", e.dm.DRAInstances(), path)
				}
			},
			gone: func(t *testing.T, e *env, path string) {
				if d := e.s.drivers.List(handler.TypeDRAPlugin); len(d) != 0 {
					t.Fatalf("DRA drivers after removal = %+v", d)
				}
				testutil.WaitFor(t, "devicemanager DRA instance removed", func() bool { return len(e.dm.DRAInstances()) == 0 })
			},
		},
		{
			name: "CSIPlugin",
			info: testplugin.Info{Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"0.3.0", "1.0.0", "1.2.0"}},
			opts: []testplugin.Options{csiOptions("csi.example.com")},
			registered: func(t *testing.T, e *env, path string) {
				d := e.s.drivers.List(handler.TypeCSIPlugin)
				if len(d) != 1 || d[0].Name != "csi.example.com" || d[0].CSI.NodeID != "node-1" || d[0].CSI.MaxVolumesPerNode != 16 ||
					d[0].CSI.AccessibleTopology["topology.example.com/zone"] != "a" || d[0].CSI.HighestVersion != "1.2.0" || d[0].CSI.VendorVersion != "" {
					t.Fatalf("CSI drivers = %+v", d)
				}
			},
			gone: func(t *testing.T, e *env, path string) {
				if d := e.s.drivers.List(handler.TypeCSIPlugin); len(d) != 0 {
					t.Fatalf("CSI drivers after removal = %+v", d)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.plugin("p", tc.info, tc.opts...)
			e.w.Created(t, p.Path())
			if _, err := p.WaitStatus(waitCtx(t), testplugin.Registered); err != nil {
				t.Fatal(err)
			}
			st := e.waitRegistered(p.Path())
			if st.Name != tc.info.Name || st.Type != tc.info.Type || st.Endpoint != p.Path() || st.Generation != testutil.Generation(t, p.Path()) || st.Failures != 0 || st.LastError != "" {
				t.Fatalf("status = %+v", st)
			}
			if a, ok := e.s.loop.ASW().Get(p.Path()); !ok || a.Generation != st.Generation {
				t.Fatalf("ASW entry = %+v, %v", a, ok)
			}
			tc.registered(t, e, p.Path())

			p.Stop()
			e.w.Deleted(p.Path())
			e.waitGone(p.Path())
			tc.gone(t, e, p.Path())
			if n := len(p.Statuses()); n != 1 {
				t.Fatalf("plugin got %d notifications, want 1 (unregistration does not contact it)", n)
			}
		})
	}
}

// A socket deleted, then created again, is deregistered, then registered
// again, in that order, as in the kubelet.
func TestReregistrationAfterSocketDeletion(t *testing.T) {
	e := newEnv(t)
	p := e.plugin("dev", devicePlugin("example.com/dev"))
	path := p.Path()
	e.w.Created(t, path)
	old := e.waitRegistered(path).Generation

	p.Stop()
	e.w.Deleted(path)
	e.waitGone(path)
	p2 := e.plugin("dev", devicePlugin("example.com/dev"))
	e.w.Created(t, path)
	if _, err := p2.WaitStatus(waitCtx(t), testplugin.Registered); err != nil {
		t.Fatal(err)
	}
	st := e.waitRegistered(path)
	if st.Generation == old {
		t.Fatal("generation did not change on recreation")
	}
	calls := strings.Join(e.dm.Calls(), "\n")
	want := strings.Join([]string{"register " + path + " " + old, "deregister " + path + " " + old, "register " + path + " " + st.Generation}, "\n")
	if calls != want {
		t.Fatalf("devicemanager calls:\n%s\nwant:\n%s", calls, want)
	}
}

// Done better than the kubelet (DESIGN "Restarts without a dip"): a socket
// recreated while still wanted (the watcher reports the new generation)
// is registered with its new generation in place of the old one, so the
// devicemanager replaces the endpoint without a dip. The old registration
// is deregistered only when what it named changed: another endpoint, or
// another resource on the same endpoint (refused ALREADY_EXISTS until the
// old one goes).
func TestRecreatedSocketReplacesRegistrationInPlace(t *testing.T) {
	for _, tc := range []struct {
		name string
		// second is the recreated plugin's info; endpoint and second's
		// endpoint are file names under plugins_registry ("" = the socket).
		endpoint, secondEndpoint string
		resource, secondResource string
		want                     func(path, ep1, ep2, old, cur string) []string
	}{
		{
			name: "same endpoint", resource: "example.com/dev", secondResource: "example.com/dev",
			want: func(path, _, _, old, cur string) []string {
				return []string{"register " + path + " " + old, "register " + path + " " + cur}
			},
		},
		{
			name: "new endpoint", endpoint: "ep1", secondEndpoint: "ep2", resource: "example.com/dev", secondResource: "example.com/dev",
			want: func(_, ep1, ep2, old, cur string) []string {
				return []string{"register " + ep1 + " " + old, "register " + ep2 + " " + cur, "deregister " + ep1 + " " + old}
			},
		},
		{
			name: "renamed resource", resource: "example.com/dev", secondResource: "example.com/renamed",
			want: func(path, _, _, old, cur string) []string {
				return []string{"register " + path + " " + old, "register " + path + " " + cur, "deregister " + path + " " + old, "register " + path + " " + cur}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			// The endpoints exist (the fake devicemanager never dials
			// them): a device plugin's missing endpoint is waited for.
			ep := func(name string) string {
				if name == "" {
					return ""
				}
				if _, err := os.Lstat(e.sock(name)); err != nil {
					testutil.StaleSocket(t, e.sock(name))
				}
				return e.sock(name)
			}
			info := devicePlugin(tc.resource)
			info.Endpoint = ep(tc.endpoint)
			p := e.plugin("dev", info)
			path := p.Path()
			e.w.Created(t, path)
			old := e.waitRegistered(path).Generation

			p.Stop()
			info2 := devicePlugin(tc.secondResource)
			info2.Endpoint = ep(tc.secondEndpoint)
			p2 := e.plugin("dev", info2)
			e.w.Created(t, path)
			if _, err := p2.WaitStatus(waitCtx(t), testplugin.Registered); err != nil {
				t.Fatal(err)
			}
			st := e.waitRegistered(path)
			if st.Generation == old {
				t.Fatal("generation did not change on recreation")
			}
			ep1, ep2 := path, path
			if tc.endpoint != "" {
				ep1, ep2 = ep(tc.endpoint), ep(tc.secondEndpoint)
			}
			if got, want := strings.Join(e.dm.Calls(), "\n"), strings.Join(tc.want(path, ep1, ep2, old, st.Generation), "\n"); got != want {
				t.Fatalf("devicemanager calls:\n%s\nwant:\n%s", got, want)
			}
			eps := e.dm.Endpoints()
			if len(eps) != 1 || eps[ep2].generation != st.Generation || eps[ep2].resource != tc.secondResource {
				t.Fatalf("devicemanager endpoints = %+v", eps)
			}
			if a, ok := e.s.loop.ASW().Get(path); !ok || a.Generation != st.Generation || a.Name != tc.secondResource {
				t.Fatalf("ASW entry = %+v, %v", a, ok)
			}
		})
	}
}

// A recreated socket whose new generation fails to register leaves no
// registration of the old generation behind: the old socket is gone.
func TestRecreatedSocketFailingDropsOldRegistration(t *testing.T) {
	e := newEnv(t)
	p := e.plugin("dev", devicePlugin("example.com/dev"))
	path := p.Path()
	e.w.Created(t, path)
	old := e.waitRegistered(path).Generation
	p.Stop()
	p2 := e.plugin("dev", testplugin.Info{Type: "DevicePlugin", Name: "example.com/dev", Versions: []string{"v1alpha1"}})
	e.w.Created(t, path)
	if _, err := p2.WaitStatus(waitCtx(t), testplugin.Rejected); err != nil {
		t.Fatal(err)
	}
	e.waitFailed(path, 1)
	testutil.WaitFor(t, "old registration removed", func() bool { return len(e.dm.Endpoints()) == 0 })
	want := []string{"register " + path + " " + old, "deregister " + path + " " + old}
	if got := e.dm.Calls(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("devicemanager calls %v, want %v", got, want)
	}
	if _, ok := e.s.loop.ASW().Get(path); ok {
		t.Fatal("ASW keeps the old generation")
	}
}

// The kubelet's behaviour: refused registrations are told to the plugin
// in the kubelet's words (pluginmanager operationexecutor: "no handler
// registered for plugin type: T at socket S", "plugin validation failed
// with err: E", without nodeplug's ": invalid argument" suffixes), nothing
// is recorded, and the socket backs off. ListPlugins' last error keeps
// nodeplug's detail: the socket, the plugin and the failed step.
func TestRefusedRegistrations(t *testing.T) {
	for _, tc := range []struct {
		name string
		info testplugin.Info
		want string
	}{
		{"unknown type", testplugin.Info{Type: "FooPlugin", Name: "foo.example.com"}, "no handler registered for plugin type: FooPlugin"},
		{"device plugin version", testplugin.Info{Type: "DevicePlugin", Name: "example.com/dev", Versions: []string{"v1alpha1"}}, "manager version, v1beta1, is not among plugin supported versions [v1alpha1]"},
		{"device plugin name", testplugin.Info{Type: "DevicePlugin", Name: "kubernetes.io/dev", Versions: []string{"v1beta1"}}, `invalid name of device plugin socket: the ResourceName "kubernetes.io/dev" is invalid`},
		{"DRA no versions", testplugin.Info{Type: "DRAPlugin", Name: "dra.example.com"}, "empty list of supported gRPC services"},
		{"DRA unknown service", testplugin.Info{Type: "DRAPlugin", Name: "dra.example.com", Versions: []string{"v1alpha3.Node"}}, "none of services supported by the plugin"},
		{"CSI version 2", testplugin.Info{Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"2.0.0"}}, "None of the versions specified"},
		{"endpoint outside allowed dirs", testplugin.Info{Type: "DRAPlugin", Name: "dra.example.com", Endpoint: "/nonexistent-np/dra.sock", Versions: []string{"v1.DRAPlugin"}}, `endpoint not allowed: endpoint "/nonexistent-np/dra.sock" is outside the allowed directories`},
		{"endpoint with ..", testplugin.Info{Type: "DRAPlugin", Name: "dra.example.com", Endpoint: "/tmp/../etc/dra.sock", Versions: []string{"v1.DRAPlugin"}}, `contains ".."`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			p := e.plugin("bad", tc.info)
			e.w.Created(t, p.Path())
			got, err := p.WaitStatus(waitCtx(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Registered {
				t.Fatal("plugin was told it registered")
			}
			if tc.info.Type == "FooPlugin" {
				if want := "RegisterPlugin error -- no handler registered for plugin type: FooPlugin at socket " + p.Path(); got.Error != want {
					t.Errorf("reason %q, want %q", got.Error, want)
				}
			} else {
				const prefix = "RegisterPlugin error -- plugin validation failed with err: "
				if !strings.HasPrefix(got.Error, prefix) || !strings.Contains(got.Error, tc.want) || strings.HasSuffix(got.Error, ": invalid argument") {
					t.Errorf("reason %q, want %q followed by the validation error (%q) in the kubelet's words", got.Error, prefix, tc.want)
				}
			}
			st := e.waitFailed(p.Path(), 1)
			for _, want := range []string{tc.want, p.Path(), fmt.Sprintf("%q", tc.info.Name)} {
				if !strings.Contains(st.LastError, want) {
					t.Errorf("last error %q does not contain %q", st.LastError, want)
				}
			}
			if want := e.clk.Now().Add(executor.InitialBackoff); !st.NextRetry.Equal(want) {
				t.Errorf("next retry %v, want %v", st.NextRetry, want)
			}
			if _, ok := e.s.loop.ASW().Get(p.Path()); ok {
				t.Error("refused plugin is in the ASW")
			}
			if n := len(e.dm.Calls()) + len(e.dm.DRACalls()); n != 0 {
				t.Errorf("devicemanager got %d calls", n)
			}
		})
	}
}

// The kubelet's behaviour: a GetInfo that hangs past its 1 s budget is a
// failure with backoff, and the plugin is not notified.
func TestGetInfoTimeoutBacksOff(t *testing.T) {
	e := newEnv(t)
	p := e.plugin("slow", draPlugin("dra.example.com"))
	p.SetGetInfoDelay(time.Minute)
	e.w.Created(t, p.Path())
	testutil.WaitFor(t, "GetInfo called", func() bool { return p.GetInfoCalls() == 1 })
	if st, _ := e.status(p.Path()); st.State != status.StatePending {
		t.Fatalf("status before the budget ended = %+v, want pending", st)
	}
	e.expireGetInfo()
	st := e.waitFailed(p.Path(), 1)
	if !strings.Contains(st.LastError, "GetInfo") || !strings.Contains(st.LastError, p.Path()) || !strings.Contains(st.LastError, "no answer within 1s") {
		t.Fatalf("last error = %q", st.LastError)
	}
	if n := len(p.Statuses()); n != 0 {
		t.Fatalf("plugin got %d notifications after a failed GetInfo", n)
	}
	p.SetGetInfoDelay(0)
	e.advanceBackoff()
	e.waitRegistered(p.Path())
	if n := p.GetInfoCalls(); n != 2 {
		t.Fatalf("GetInfo calls = %d, want 2", n)
	}
}

// The kubelet's behaviour: a failed NotifyRegistrationStatus(true) undoes
// the registration (ASW entry and handler) and is retried.
func TestNotifyFailureIsRetried(t *testing.T) {
	e := newEnv(t)
	p := e.plugin("dev", devicePlugin("example.com/dev"))
	p.SetNotifyError(errors.New("plugin is busy"))
	gen := ""
	e.w.Created(t, p.Path())
	gen = testutil.Generation(t, p.Path())
	st := e.waitFailed(p.Path(), 1)
	if !strings.Contains(st.LastError, "plugin is busy") {
		t.Fatalf("last error = %q", st.LastError)
	}
	if _, ok := e.s.loop.ASW().Get(p.Path()); ok {
		t.Fatal("ASW keeps a plugin whose notification failed")
	}
	want := []string{"register " + p.Path() + " " + gen, "deregister " + p.Path() + " " + gen}
	if got := e.dm.Calls(); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("devicemanager calls %v, want %v", got, want)
	}
	p.SetNotifyError(nil)
	e.advanceBackoff()
	e.waitRegistered(p.Path())
	if _, ok := e.dm.Endpoints()[p.Path()]; !ok {
		t.Fatal("devicemanager lacks the endpoint after the retry")
	}
}

// The kubelet's behaviour: a handler failure removes the ASW entry and is
// told to the plugin, then retried.
func TestHandlerFailureRollsBackASW(t *testing.T) {
	e := newEnv(t)
	e.dm.SetRegisterError(fmt.Errorf("failed to get device plugin options: %w", errdefs.ErrFailedPrecondition))
	p := e.plugin("dev", devicePlugin("example.com/dev"))
	e.w.Created(t, p.Path())
	got, err := p.WaitStatus(waitCtx(t), testplugin.Rejected)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"plugin registration failed", "failed to get device plugin options", p.Path(), "example.com/dev"} {
		if !strings.Contains(got.Error, want) {
			t.Errorf("reason %q lacks %q", got.Error, want)
		}
	}
	e.waitFailed(p.Path(), 1)
	if _, ok := e.s.loop.ASW().Get(p.Path()); ok {
		t.Fatal("ASW keeps a plugin whose handler failed")
	}
	e.dm.SetRegisterError(nil)
	e.advanceBackoff()
	e.waitRegistered(p.Path())
	if _, err := p.WaitStatus(waitCtx(t), testplugin.Registered); err != nil {
		t.Fatal(err)
	}
}

// The kubelet's behaviour: when the devicemanager refuses a registration,
// the plugin is told "RegisterPlugin error -- plugin registration failed
// with err: " and the kubelet's message, which the devicemanager sends as
// an ErrorInfo detail (KUBELET_MESSAGE); ListPlugins keeps nodeplug's
// detail.
func TestRegisterErrorInKubeletWords(t *testing.T) {
	e := newEnv(t)
	const kubeletMsg = "failed to get device plugin options: rpc error: code = Unimplemented desc = boom"
	st, err := grpcstatus.New(codes.FailedPrecondition, "endpoint /x: GetDevicePluginOptions: boom").WithDetails(&errdetails.ErrorInfo{
		Domain: "nodeplug.devicemanager.v1", Reason: "KUBELET_MESSAGE", Metadata: map[string]string{"message": kubeletMsg},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.dm.SetRegisterError(st.Err())
	p := e.plugin("dev", devicePlugin("example.com/dev"))
	e.w.Created(t, p.Path())
	got, err := p.WaitStatus(waitCtx(t), testplugin.Rejected)
	if err != nil {
		t.Fatal(err)
	}
	if want := "RegisterPlugin error -- plugin registration failed with err: " + kubeletMsg; got.Error != want {
		t.Fatalf("reason %q, want %q", got.Error, want)
	}
	ps := e.waitFailed(p.Path(), 1)
	for _, want := range []string{"GetDevicePluginOptions: boom", p.Path(), `"example.com/dev"`} {
		if !strings.Contains(ps.LastError, want) {
			t.Errorf("last error %q lacks %q", ps.LastError, want)
		}
	}
}

// Done better than the kubelet: a stale socket (its plugin died and left
// the file; it refuses connections) fails on its own once the bind→listen
// gap is over, without waiting for the GetInfo budget, while the other
// plugins of the same pass register, and its retries come due by
// themselves, 500 ms then 1 s after each failure.
func TestStaleSocketBacksOffWhileOthersRegister(t *testing.T) {
	e := newEnv(t)
	stale := e.sock("stale")
	testutil.StaleSocket(t, stale)
	var good []*testplugin.Plugin
	for i := range 3 {
		good = append(good, e.plugin(fmt.Sprintf("good%d", i), draPlugin(fmt.Sprintf("dra%d.example.com", i))))
	}
	// One snapshot with all four: they start in the same pass.
	streams := e.w.Streams()
	e.w.Restart(func(m map[string]string) {
		m[stale] = testutil.Generation(t, stale)
		for _, p := range good {
			m[p.Path()] = testutil.Generation(t, p.Path())
		}
	})
	testutil.WaitFor(t, "new watcher stream", func() bool { return e.w.Streams() > streams })
	for _, p := range good {
		e.waitRegistered(p.Path())
	}
	// The clock has not moved: the stale socket failed before its GetInfo
	// budget could end.
	st := e.waitFailed(stale, 1)
	for _, want := range []string{stale, "refuses connections"} {
		if !strings.Contains(st.LastError, want) {
			t.Fatalf("last error = %q, want it to contain %q", st.LastError, want)
		}
	}
	if want := e.clk.Now().Add(500 * time.Millisecond); !st.NextRetry.Equal(want) {
		t.Fatalf("next retry %v, want %v", st.NextRetry, want)
	}
	e.clk.Advance(500 * time.Millisecond)
	st = e.waitFailed(stale, 2)
	if want := e.clk.Now().Add(time.Second); !st.NextRetry.Equal(want) {
		t.Fatalf("second next retry %v, want %v", st.NextRetry, want)
	}
	for _, p := range good {
		if s, _ := e.status(p.Path()); s.State != status.StateRegistered {
			t.Fatalf("%s: %v", p.Path(), s.State)
		}
	}
}

// DESIGN "Stale sockets": stale sockets never hold the workers new sockets
// need. With far more stale sockets than workers (closed listeners and
// sockets bound but never listening), reported before it, a healthy plugin
// registers while every stale socket is still at its first attempt or in
// the backoff after it (the clock never moves, so no backoff ends). Before,
// each stale socket held a worker for its whole GetInfo budget, and the
// healthy plugin queued behind them.
func TestStaleSocketsDoNotHoldWorkers(t *testing.T) {
	e := newEnv(t)
	var stale []string
	for i := range 200 {
		path := e.sock(fmt.Sprintf("stale%03d", i))
		if i%2 == 0 {
			testutil.StaleSocket(t, path)
		} else {
			fd, err := bindWithoutListen(path)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = unix.Close(fd) })
		}
		stale = append(stale, path)
		e.w.Created(t, path)
	}
	p := e.plugin("healthy", draPlugin("dra.example.com"))
	e.w.Created(t, p.Path())
	e.waitRegistered(p.Path())
	failed := 0
	for _, path := range stale {
		st, ok := e.status(path)
		if !ok || st.Failures > 1 || (st.State != status.StatePending && st.State != status.StateFailed) {
			t.Fatalf("%s when the healthy plugin registered: %+v (known %v), want pending or failed once", path, st, ok)
		}
		if st.State == status.StateFailed {
			failed++
		}
	}
	// Every stale socket then fails its first attempt and waits out its
	// backoff.
	for _, path := range stale {
		st := e.waitFailed(path, 1)
		if want := e.clk.Now().Add(executor.InitialBackoff); !st.NextRetry.Equal(want) {
			t.Fatalf("%s: next retry %v, want %v", path, st.NextRetry, want)
		}
	}
	t.Logf("%d of %d stale sockets had failed when the healthy plugin registered", failed, len(stale))
}

// Done better than the kubelet: a socket recreated after failures is
// attempted at once instead of waiting out the old generation's backoff.
func TestRecreatedSocketSkipsOldBackoff(t *testing.T) {
	e := newEnv(t)
	path := e.sock("flaky")
	testutil.StaleSocket(t, path)
	e.w.Created(t, path)
	e.waitFailed(path, 1)
	e.advanceBackoff()
	st := e.waitFailed(path, 2)
	now, retryAt := e.clk.Now(), st.NextRetry
	if !retryAt.After(now) {
		t.Fatalf("not in backoff: next retry %v, now %v", retryAt, now)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	e.w.Deleted(path)
	p := e.plugin("flaky", draPlugin("dra.example.com"))
	e.w.Created(t, p.Path())
	// The clock does not move: the old backoff (1 s) is still running.
	st = e.waitRegistered(path)
	if st.Failures != 0 || st.LastError != "" {
		t.Fatalf("status after recreation = %+v", st)
	}
	if !e.clk.Now().Equal(now) || !e.clk.Now().Before(retryAt) {
		t.Fatalf("registered at %v, old generation's retry due at %v", e.clk.Now(), retryAt)
	}
}

// fsnotify reports a socket at bind(), possibly before listen(): a refused
// connection within the bind→listen window is redialled at once and is not
// a failure. (The window is widened here so that the test's listen() comes
// within it however slowly the test runs.)
func TestSocketBoundBeforeListenIsNotAFailure(t *testing.T) {
	e := newEnvWith(t, func(c *config) { c.RefusedWindow = testutil.Deadline })
	path := e.sock("late")
	fd, err := bindWithoutListen(path)
	if err != nil {
		t.Fatal(err)
	}
	e.w.Created(t, path)
	// Wait until the registration attempt is under way, then listen.
	e.waitState(path, "attempt started", func(s status.PluginStatus) bool { return s.LastTraceID != "" })
	lis, err := listenOn(fd, path)
	if err != nil {
		t.Fatal(err)
	}
	p := testplugin.Serve(lis, path, draPlugin("dra.example.com"))
	t.Cleanup(p.Stop)
	st := e.waitState(path, "attempt finished", func(s status.PluginStatus) bool { return s.State != status.StatePending })
	if st.State != status.StateRegistered || st.Failures != 0 {
		t.Fatalf("status = %+v, want registered at the first attempt", st)
	}
	if n := len(p.Statuses()); n != 1 {
		t.Fatalf("notifications = %d", n)
	}
}

// Only a first attempt meets the bind→listen gap: a retry of a socket that
// refuses connections connects once and fails, however wide the refused
// window, so a stale socket's retries cost one connect each. (The window is
// made far longer than the test's wait: a retry that used it would never
// fail in time.)
func TestRetryOfARefusingSocketConnectsOnce(t *testing.T) {
	e := newEnvWith(t, func(c *config) { c.RefusedWindow = time.Hour })
	p := e.plugin("died", draPlugin("dra.example.com"))
	path := p.Path()
	p.SetGetInfoError(errors.New("not ready"))
	e.w.Created(t, path)
	e.waitFailed(path, 1)
	// The plugin dies and leaves a socket file that refuses connections.
	p.Stop()
	testutil.StaleSocket(t, path)
	e.advanceBackoff()
	st := e.waitFailed(path, 2)
	if !strings.Contains(st.LastError, "refuses connections") {
		t.Fatalf("retry failed with %q, want a refused connection", st.LastError)
	}
}

// A socket removed while its registration is under way cancels it: the
// devicemanager's RegisterPlugin (here one that waits, as for an endpoint
// file that does not appear, until it is cancelled) ends, and the socket is
// forgotten. Without the cancellation the wait would outlast the test.
func TestRemovedSocketCancelsItsRegistration(t *testing.T) {
	e := newEnv(t)
	testutil.StaleSocket(t, e.sock("never")) // the endpoint file exists; it is never served
	p := e.plugin("waits", testplugin.Info{Type: "DevicePlugin", Name: "example.com/waits", Versions: []string{"v1beta1"}, Endpoint: e.sock("never")})
	e.dm.Hold(e.sock("never"))
	gen := testutil.Generation(t, p.Path())
	e.w.Created(t, p.Path())
	testutil.WaitFor(t, "RegisterPlugin under way", func() bool { return slices.Contains(e.dm.Calls(), "register "+e.sock("never")+" "+gen) })
	e.w.Deleted(p.Path())
	e.waitGone(p.Path())
	// The devicemanager's handler sees the cancellation when it reaches
	// it over the connection, which may be after the reconciler forgot
	// the socket; a RegisterPlugin never cancelled would hold until the
	// wait's deadline.
	testutil.WaitFor(t, "RegisterPlugin cancelled", func() bool {
		return slices.Contains(e.dm.Calls(), "cancelled "+e.sock("never")+" "+gen)
	})
	if n := len(p.Statuses()); n != 0 {
		t.Fatalf("the plugin was told %v", p.Statuses())
	}
	// Nothing is left downstream, and a new socket registers as usual.
	if eps := e.dm.Endpoints(); len(eps) != 0 {
		t.Fatalf("devicemanager endpoints %v", eps)
	}
	q := e.plugin("next", devicePlugin("example.com/next"))
	e.w.Created(t, q.Path())
	e.waitRegistered(q.Path())
}

// A device plugin whose endpoint does not exist yet is waited for without
// a worker: with a single worker, another plugin registers meanwhile; once
// the endpoint appears, the first registers too.
func TestEndpointWaitHoldsNoWorker(t *testing.T) {
	e := newEnvWith(t, func(c *config) { c.MaxParallel = 1; c.EndpointWait = time.Hour })
	late := e.plugin("late", testplugin.Info{Type: "DevicePlugin", Name: "example.com/late", Versions: []string{"v1beta1"}, Endpoint: e.sock("late-endpoint")})
	e.w.Created(t, late.Path())
	testutil.WaitFor(t, "GetInfo of the plugin whose endpoint is missing", func() bool { return late.GetInfoCalls() == 1 })
	other := e.plugin("other", draPlugin("dra.example.com"))
	e.w.Created(t, other.Path())
	e.waitRegistered(other.Path())
	if st, _ := e.status(late.Path()); st.State == status.StateRegistered {
		t.Fatalf("registered before its endpoint exists: %+v", st)
	}
	testutil.StaleSocket(t, e.sock("late-endpoint")) // the endpoint appears
	e.waitRegistered(late.Path())
}

// An endpoint that does not appear within the wait fails the registration
// with the kubelet's words, and the devicemanager is never asked.
func TestEndpointThatNeverAppears(t *testing.T) {
	e := newEnvWith(t, func(c *config) { c.EndpointWait = 20 * time.Millisecond })
	p := e.plugin("lost", testplugin.Info{Type: "DevicePlugin", Name: "example.com/lost", Versions: []string{"v1beta1"}, Endpoint: e.sock("lost-endpoint")})
	e.w.Created(t, p.Path())
	st, err := p.WaitStatus(waitCtx(t), testplugin.Rejected)
	if err != nil {
		t.Fatal(err)
	}
	if want := "RegisterPlugin error -- plugin registration failed with err: failed to dial device plugin: context deadline exceeded"; st.Error != want {
		t.Fatalf("told %q, want %q", st.Error, want)
	}
	for _, c := range e.dm.Calls() {
		if strings.Contains(c, e.sock("lost-endpoint")) {
			t.Fatalf("the devicemanager was asked: %v", e.dm.Calls())
		}
	}
}

// A socket removed while its device plugin's endpoint is waited for ends
// the wait at once: the socket is forgotten, the devicemanager never asked.
// (The wait is made far longer than the test's: only the removal ends it.)
func TestRemovedSocketEndsTheEndpointWait(t *testing.T) {
	e := newEnvWith(t, func(c *config) { c.EndpointWait = time.Hour })
	p := e.plugin("gone", testplugin.Info{Type: "DevicePlugin", Name: "example.com/gone", Versions: []string{"v1beta1"}, Endpoint: e.sock("gone-endpoint")})
	e.w.Created(t, p.Path())
	testutil.WaitFor(t, "GetInfo of the plugin whose endpoint is missing", func() bool { return p.GetInfoCalls() == 1 })
	e.w.Deleted(p.Path())
	e.waitGone(p.Path())
	for _, c := range e.dm.Calls() {
		if strings.Contains(c, e.sock("gone-endpoint")) {
			t.Fatalf("the devicemanager was asked: %v", e.dm.Calls())
		}
	}
	if n := len(p.Statuses()); n != 0 {
		t.Fatalf("the plugin was told %v", p.Statuses())
	}
}

// A socket recreated while the registration of its previous generation is
// under way cancels that registration and registers the new one.
func TestRecreatedSocketCancelsTheOldRegistration(t *testing.T) {
	e := newEnv(t)
	testutil.StaleSocket(t, e.sock("held"))
	info := testplugin.Info{Type: "DevicePlugin", Name: "example.com/again", Versions: []string{"v1beta1"}, Endpoint: e.sock("held")}
	p := e.plugin("again", info)
	e.dm.Hold(e.sock("held"))
	gen := testutil.Generation(t, p.Path())
	e.w.Created(t, p.Path())
	testutil.WaitFor(t, "RegisterPlugin under way", func() bool { return slices.Contains(e.dm.Calls(), "register "+e.sock("held")+" "+gen) })
	p.Stop()
	info.Endpoint = ""
	p = e.plugin("again", info)
	newGen := testutil.Generation(t, p.Path())
	if newGen == gen {
		t.Fatal("the recreated socket kept its generation")
	}
	e.w.Created(t, p.Path())
	st := e.waitRegistered(p.Path())
	if st.Generation != newGen {
		t.Fatalf("registered generation %s, want %s", st.Generation, newGen)
	}
	testutil.WaitFor(t, "the old RegisterPlugin cancelled", func() bool {
		return slices.Contains(e.dm.Calls(), "cancelled "+e.sock("held")+" "+gen)
	})
}

// Done better than the kubelet: a watcher restart (a new stream whose
// snapshot has the same generations) deregisters nothing; a socket that
// vanished meanwhile leaves.
func TestWatcherRestartCausesNoDeregistration(t *testing.T) {
	e := newEnv(t)
	a := e.plugin("a", devicePlugin("example.com/a"))
	b := e.plugin("b", devicePlugin("example.com/b"))
	c := e.plugin("c", draPlugin("dra.example.com"))
	e.createdRegistered(a, b, c)
	b.Stop()
	streams := e.w.Streams()
	e.w.Restart(func(m map[string]string) { delete(m, b.Path()) })
	testutil.WaitFor(t, "new watcher stream", func() bool { return e.w.Streams() > streams })
	e.waitGone(b.Path())
	// A barrier: a plugin created after the restart registers; any
	// deregistration from the restart would have started before it.
	d := e.plugin("d", draPlugin("dra2.example.com"))
	e.w.Created(t, d.Path())
	e.waitRegistered(d.Path())
	for _, p := range []*testplugin.Plugin{a, c} {
		if n, calls := len(p.Statuses()), p.GetInfoCalls(); n != 1 || calls != 1 {
			t.Fatalf("%s: %d notifications, %d GetInfo calls; want 1 and 1", p.Path(), n, calls)
		}
		if s, _ := e.status(p.Path()); s.State != status.StateRegistered {
			t.Fatalf("%s: %v", p.Path(), s.State)
		}
	}
	for _, call := range e.dm.Calls() {
		if strings.HasPrefix(call, "deregister "+a.Path()) {
			t.Fatalf("device plugin a was deregistered: %v", e.dm.Calls())
		}
	}
	if _, ok := e.dm.Endpoints()[b.Path()]; ok {
		t.Fatal("vanished socket b is still registered downstream")
	}
	if len(e.s.drivers.List(handler.TypeDRAPlugin)) != 2 {
		t.Fatalf("DRA drivers = %+v", e.s.drivers.List(handler.TypeDRAPlugin))
	}
}

// Done better than the kubelet: a reconciler restart contacts no plugin
// whose socket kept its generation (no GetInfo, no NotifyRegistrationStatus:
// it adopts them from the registrations file and registers them with their
// handlers again), duplicates nothing downstream, deregisters what vanished
// while it was down, registers what was recreated from GetInfo on, and
// rebuilds the CSI and DRA records.
func TestReconcilerRestart(t *testing.T) {
	e := newEnv(t)
	a := e.plugin("a", devicePlugin("example.com/a"))
	b := e.plugin("b", devicePlugin("example.com/b"))
	c := e.plugin("c", draPlugin("dra.example.com"))
	d := e.plugin("d", testplugin.Info{Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"1.0.0"}}, csiOptions("csi.example.com"))
	f := e.plugin("f", devicePlugin("example.com/f"))
	e.createdRegistered(a, b, c, d, f)
	genA := e.dm.Endpoints()[a.Path()].generation
	e.stop()
	// While the reconciler is down, b goes away and f is recreated by a
	// plugin that now hangs: neither old registration may survive.
	b.Stop()
	e.w.Deleted(b.Path())
	f.Stop()
	e.w.Deleted(f.Path())
	f2 := e.plugin("f", devicePlugin("example.com/f"))
	f2.SetGetInfoDelay(time.Minute)
	e.w.Created(t, f2.Path())
	dmCalls := len(e.dm.Calls())
	e.start()
	for _, p := range []*testplugin.Plugin{a, c, d} {
		e.waitRegistered(p.Path())
	}
	e.expireGetInfo()
	e.waitFailed(f2.Path(), 1)
	// Registered with the handlers again: a's endpoint by the
	// devicemanager, the DRA and CSI records rebuilt.
	testutil.WaitFor(t, "a registered with the devicemanager again, and the DRA and CSI records rebuilt", func() bool {
		return slices.Contains(e.dm.Calls()[dmCalls:], "register "+a.Path()+" "+genA) &&
			len(e.s.drivers.List(handler.TypeDRAPlugin)) == 1 && len(e.s.drivers.List(handler.TypeCSIPlugin)) == 1
	})
	for _, p := range []*testplugin.Plugin{a, c, d} {
		if calls, sts := p.GetInfoCalls(), p.Statuses(); calls != 1 || len(sts) != 1 || !sts[0].Registered {
			t.Errorf("%s was contacted again after the restart: %d GetInfo calls, notifications %+v; want 1 and one registered", p.Path(), calls, sts)
		}
	}
	testutil.WaitFor(t, "vanished and stale endpoints swept", func() bool {
		eps := e.dm.Endpoints()
		_, hasB := eps[b.Path()]
		_, hasF := eps[f.Path()]
		return !hasB && !hasF
	})
	eps := e.dm.Endpoints()
	if len(eps) != 1 || eps[a.Path()].generation != genA {
		t.Fatalf("devicemanager endpoints = %+v, want only %s with generation %s", eps, a.Path(), genA)
	}
	if dra, csiDrivers := e.s.drivers.List(handler.TypeDRAPlugin), e.s.drivers.List(handler.TypeCSIPlugin); len(dra) != 1 || dra[0].SocketPath != c.Path() || len(csiDrivers) != 1 || csiDrivers[0].CSI.NodeID != "node-1" {
		t.Fatalf("drivers after restart: DRA %+v, CSI %+v", dra, csiDrivers)
	}
	var sawDeregB bool
	for _, call := range e.dm.Calls() {
		if strings.HasPrefix(call, "deregister "+a.Path()) {
			t.Fatalf("a was deregistered: %v", e.dm.Calls())
		}
		sawDeregB = sawDeregB || strings.HasPrefix(call, "deregister "+b.Path())
	}
	if !sawDeregB {
		t.Fatalf("b was not deregistered: %v", e.dm.Calls())
	}
}

// A devicemanager restart (new instance ID) makes every registered device
// plugin and DRA driver register with it again, without the plugin
// recreating its socket or being contacted.
func TestDeviceManagerRestartReregisters(t *testing.T) {
	e := newEnv(t)
	a := e.plugin("a", devicePlugin("example.com/a"))
	b := e.plugin("b", devicePlugin("example.com/b"))
	c := e.plugin("c", draPlugin("dra.example.com"))
	e.createdRegistered(a, b, c)
	want := e.dm.Endpoints()
	wantDRA := e.dm.DRAInstances()[c.Path()]
	testutil.WaitFor(t, "devicemanager instance known", func() bool { return e.s.dm.Instance() != "" })
	e.dm.Restart()
	testutil.WaitFor(t, "endpoints and DRA driver registered again", func() bool {
		got := e.dm.Endpoints()
		dra, ok := e.dm.DRAInstances()[c.Path()]
		return len(got) == 2 && got[a.Path()] == want[a.Path()] && got[b.Path()] == want[b.Path()] && ok && dra.generation == wantDRA.generation
	})
	for _, p := range []*testplugin.Plugin{a, b, c} {
		if n, calls := len(p.Statuses()), p.GetInfoCalls(); n != 1 || calls != 1 {
			t.Fatalf("%s: %d notifications, %d GetInfo calls; want 1 and 1", p.Path(), n, calls)
		}
		if s, _ := e.status(p.Path()); s.State != status.StateRegistered || s.Generation != testutil.Generation(t, p.Path()) {
			t.Fatalf("%s: %+v", p.Path(), s)
		}
	}
}

// A socket removed while its registration again (after a devicemanager
// restart) is under way cancels it, as it cancels a first registration:
// the devicemanager's wait for the gone plugin's endpoint ends at once.
func TestRemovedSocketCancelsItsRegistrationAgain(t *testing.T) {
	e := newEnv(t)
	a := e.plugin("a", devicePlugin("example.com/a"))
	gen := testutil.Generation(t, a.Path())
	e.w.Created(t, a.Path())
	e.waitRegistered(a.Path())
	testutil.WaitFor(t, "devicemanager instance known", func() bool { return e.s.dm.Instance() != "" })
	e.dm.Hold(a.Path())
	e.dm.Restart()
	testutil.WaitFor(t, "RegisterPlugin again under way", func() bool {
		n := 0
		for _, c := range e.dm.Calls() {
			if c == "register "+a.Path()+" "+gen {
				n++
			}
		}
		return n == 2
	})
	e.w.Deleted(a.Path())
	e.waitGone(a.Path())
	testutil.WaitFor(t, "RegisterPlugin again cancelled", func() bool {
		return slices.Contains(e.dm.Calls(), "cancelled "+a.Path()+" "+gen)
	})
}

// A registration that failed while the devicemanager was down is retried
// as soon as a restarted devicemanager is seen, not after its backoff (the
// clock does not move here).
func TestDeviceManagerRestartRetriesFailedRegistrations(t *testing.T) {
	e := newEnv(t)
	testutil.WaitFor(t, "devicemanager instance known", func() bool { return e.s.dm.Instance() != "" })
	e.dm.SetRegisterError(grpcstatus.Error(codes.Unavailable, "devicemanager is shutting down"))
	a := e.plugin("a", devicePlugin("example.com/a"))
	e.w.Created(t, a.Path())
	e.waitFailed(a.Path(), 1)
	e.dm.SetRegisterError(nil)
	e.dm.Restart()
	e.waitRegistered(a.Path())
}

// 500 plugins created at once all register, and all deregister when
// removed (goroutine leaks are checked by TestMain).
func TestManyPlugins(t *testing.T) {
	const n = 500
	e := newEnv(t)
	plugins := make([]*testplugin.Plugin, n)
	for i := range n {
		info := draPlugin(fmt.Sprintf("dra%d.example.com", i))
		if i%2 == 0 {
			info = devicePlugin(fmt.Sprintf("example.com/dev%d", i))
		}
		plugins[i] = e.plugin(fmt.Sprintf("p%03d", i), info)
	}
	for _, p := range plugins {
		e.w.Created(t, p.Path())
	}
	testutil.Eventually(t, "all registered", func() error {
		for _, s := range e.s.status.List() {
			if s.State != status.StateRegistered {
				return fmt.Errorf("%s is %v (failures %d, last error %q)", s.SocketPath, s.State, s.Failures, s.LastError)
			}
		}
		if got := e.s.loop.ASW().Len(); got != n {
			return fmt.Errorf("%d plugins in the ASW, want %d", got, n)
		}
		return nil
	})
	if got := len(e.dm.Endpoints()); got != n/2 {
		t.Fatalf("devicemanager endpoints = %d, want %d", got, n/2)
	}
	if got := len(e.s.drivers.List(handler.TypeDRAPlugin)); got != n/2 {
		t.Fatalf("DRA drivers = %d, want %d", got, n/2)
	}
	for _, p := range plugins {
		if _, err := p.WaitStatus(waitCtx(t), testplugin.Registered); err != nil {
			t.Fatal(err)
		}
		p.Stop()
		e.w.Deleted(p.Path())
	}
	testutil.WaitFor(t, "all deregistered", func() bool {
		return e.s.loop.ASW().Len() == 0 && len(e.s.status.List()) == 0 && len(e.dm.Endpoints()) == 0 && len(e.s.drivers.List(handler.TypeDRAPlugin)) == 0
	})
	for _, s := range e.s.status.List() {
		t.Errorf("left: %+v", s)
	}
}

// The periodic resync is a safety net: a desired socket that no event woke
// the reconciler for is left alone by the passes other sockets wake, and is
// registered at the next resync.
func TestResyncIsASafetyNet(t *testing.T) {
	e := newEnv(t)
	// Each manager's watch stream opening asks for a full pass (OnReady);
	// once both are open, that has been asked.
	testutil.WaitFor(t, "the managers' watch streams open", func() bool { return e.s.dm.Ready() && e.s.dra.Ready() })
	// A registration first: the loop runs (its resync timer is armed) and
	// has made the full passes that the watcher's snapshot and the
	// streams asked for.
	first := e.plugin("first", draPlugin("dra-first.example.com"))
	e.w.Created(t, first.Path())
	e.waitRegistered(first.Path())

	quiet := e.plugin("quiet", draPlugin("dra.example.com"))
	// Straight into the DSW, without waking the reconciler.
	if _, err := e.s.loop.DSW().AddOrUpdate(cache.Socket{Path: quiet.Path(), Generation: testutil.Generation(t, quiet.Path())}); err != nil {
		t.Fatal(err)
	}
	// A barrier: a pass woken for another socket after the quiet one entered
	// the DSW. Only a resync may register the quiet socket.
	other := e.plugin("other", draPlugin("dra-other.example.com"))
	e.w.Created(t, other.Path())
	e.waitRegistered(other.Path())
	if st, ok := e.status(quiet.Path()); ok || quiet.GetInfoCalls() != 0 {
		t.Fatalf("the quiet socket was handled before the resync: status %+v (present %v), %d GetInfo calls", st, ok, quiet.GetInfoCalls())
	}
	if _, ok := e.s.loop.ASW().Get(quiet.Path()); ok {
		t.Fatal("the quiet socket is in the ASW before the resync")
	}

	resyncAt := e.clk.Now().Add(reconciler.DefaultResyncPeriod)
	e.clk.Advance(reconciler.DefaultResyncPeriod)
	st := e.waitRegistered(quiet.Path())
	if st.LastTransition.Before(resyncAt) {
		t.Fatalf("registered at %v, before the resync at %v", st.LastTransition, resyncAt)
	}
	if n := quiet.GetInfoCalls(); n != 1 {
		t.Fatalf("GetInfo calls = %d, want 1", n)
	}
}

// Without a watcher, a devicemanager or a dramanager the service keeps
// retrying quietly and stops cleanly (goroutine leaks are checked by
// TestMain).
func TestRunWithoutPeers(t *testing.T) {
	root, _ := tempRoot(t)
	s, err := newService(config{
		WatcherAddr:       filepath.Join(root, "no-watcher.sock"),
		DeviceManagerAddr: filepath.Join(root, "no-dm.sock"),
		DRAManagerAddr:    filepath.Join(root, "no-dra.sock"),
		Log:               testLog(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.run(ctx) }()
	if s.loop.Synced() || len(s.status.List()) != 0 {
		t.Fatal("synced without a watcher")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
}

// Endpoints are confined to the allowed directories: a symlink that leads
// outside is refused, whether it is the endpoint or one of its parent
// directories; an endpoint inside that does not exist yet is judged by
// where it would be. (Unlike the kubelet, which takes any CSI endpoint.)
func TestEndpointConfinement(t *testing.T) {
	e := newEnv(t)
	outside := testutil.TempDir(t)
	target := filepath.Join(outside, "dra.sock")
	testutil.StaleSocket(t, target)
	link := filepath.Join(e.root, "escape.sock")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}

	esc := e.plugin("escape", testplugin.Info{Type: "DRAPlugin", Name: "dra.example.com", Endpoint: link, Versions: []string{"v1.DRAPlugin"}})
	e.w.Created(t, esc.Path())
	got, err := esc.WaitStatus(waitCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Registered || !strings.Contains(got.Error, "outside the allowed directories") {
		t.Fatalf("symlink escape: %+v", got)
	}

	// A CSI driver outside, reached through a symlinked parent directory:
	// the endpoint does not exist by its path inside, and would be the
	// driver outside once followed.
	outsideCSI := &fakeCSI{name: "csi.example.com"}
	serve(t, filepath.Join(outside, "csi.sock"), func(s *grpc.Server) {
		csi.RegisterIdentityServer(s, outsideCSI)
		csi.RegisterNodeServer(s, outsideCSI)
	})
	if err := os.Symlink(outside, filepath.Join(e.root, "csi-link")); err != nil {
		t.Fatal(err)
	}
	viaParent := e.plugin("csi-escape", testplugin.Info{Type: "CSIPlugin", Name: "csi.example.com", Endpoint: filepath.Join(e.root, "csi-link", "csi.sock"), Versions: []string{"1.0.0"}})
	e.w.Created(t, viaParent.Path())
	got, err = viaParent.WaitStatus(waitCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got.Registered || !strings.Contains(got.Error, "outside the allowed directories") {
		t.Fatalf("symlinked parent escape: %+v", got)
	}
	if n := outsideCSI.calls.Load(); n != 0 || len(e.s.drivers.List(handler.TypeCSIPlugin)) != 0 {
		t.Fatalf("the CSI driver outside got %d calls; drivers %+v", n, e.s.drivers.List(handler.TypeCSIPlugin))
	}

	// Validation accepts it; the devicemanager cannot dial it until it
	// exists, so the first attempt fails there, and the retry registers.
	later := filepath.Join(e.root, "later", "dra.sock")
	ok := e.plugin("later", testplugin.Info{Type: "DRAPlugin", Name: "dra2.example.com", Endpoint: later, Versions: []string{"v1.DRAPlugin"}})
	e.w.Created(t, ok.Path())
	got, err = ok.WaitStatus(waitCtx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "RegisterPlugin error -- plugin registration failed with err: dramanager RegisterDRADriver"; !strings.HasPrefix(got.Error, want) {
		t.Fatalf("endpoint that may appear: %+v, want accepted by validation and refused by the dramanager (%q…)", got, want)
	}
	e.waitFailed(ok.Path(), 1)
	if err := os.MkdirAll(filepath.Dir(later), 0o750); err != nil {
		t.Fatal(err)
	}
	testutil.StaleSocket(t, later)
	e.advanceBackoff()
	if st := e.waitRegistered(ok.Path()); st.Endpoint != later {
		t.Fatalf("status = %+v", st)
	}
}

// A GetInfo answer past DESIGN "Bounds" is refused, and nothing of it is
// echoed or published beyond bounds.MaxEcho bytes: a 100 KB plugin name
// gives a short reason to the plugin and a short entry in ListPlugins.
func TestOversizedGetInfoAnswers(t *testing.T) {
	long := strings.Repeat("x", 100<<10)
	const short = 4 << 10 // a generous bound on any reason or entry
	for _, tc := range []struct {
		name string
		info testplugin.Info
		want string
	}{
		{"name", testplugin.Info{Type: "DRAPlugin", Name: long, Versions: []string{"v1.DRAPlugin"}}, "plugin name"},
		{"type", testplugin.Info{Type: long, Name: "dra.example.com", Versions: []string{"v1.DRAPlugin"}}, "plugin type"},
		{"endpoint", testplugin.Info{Type: "DRAPlugin", Name: "dra.example.com", Endpoint: "/" + long, Versions: []string{"v1.DRAPlugin"}}, "107-byte limit"},
		{"versions", testplugin.Info{Type: "DRAPlugin", Name: "dra.example.com", Versions: strings.Split(long[:2000], "")}, "supported versions"},
		{"version", testplugin.Info{Type: "DRAPlugin", Name: "dra.example.com", Versions: []string{long}}, "supported version"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c := serviceClient(t, e)
			p := e.plugin("big", tc.info)
			e.w.Created(t, p.Path())
			got, err := p.WaitStatus(waitCtx(t), nil)
			if err != nil {
				t.Fatal(err)
			}
			if got.Registered || !strings.Contains(got.Error, tc.want) || len(got.Error) > short {
				t.Fatalf("plugin told registered=%v, a reason of %d bytes: %.400q", got.Registered, len(got.Error), got.Error)
			}
			e.waitFailed(p.Path(), 1)
			list, err := c.ListPlugins(waitCtx(t), &reconcilerv1.ListPluginsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if n := proto.Size(list); len(list.GetPlugins()) != 1 || n > short {
				t.Fatalf("ListPlugins: %d plugins in %d bytes", len(list.GetPlugins()), n)
			}
			if n := len(e.dm.Calls()) + len(e.s.drivers.List(handler.TypeDRAPlugin)); n != 0 {
				t.Fatalf("the refused plugin reached a handler (%d)", n)
			}
		})
	}
}

// issue 13 item 5: after a device plugin is SIGKILLed, ListPlugins agrees
// with the devicemanager. Its registration stands, as in the kubelet (the
// socket file is still there), but once the devicemanager reports the
// endpoint stopped, ListPlugins says so instead of a bare "registered";
// the note goes when the endpoint serves again, or when the restarted
// plugin registers anew.
func TestEndpointStoppedShowsInListPlugins(t *testing.T) {
	e := newEnv(t)
	c := serviceClient(t, e)
	p := e.plugin("dev", devicePlugin("example.com/dev"))
	path := p.Path()
	e.w.Created(t, path)
	gen := e.waitRegistered(path).Generation
	testutil.WaitFor(t, "the handler following WatchResources", func() bool { return e.dm.Watchers() > 0 })
	get := func() *reconcilerv1.Plugin {
		resp, err := c.ListPlugins(context.Background(), &reconcilerv1.ListPluginsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, pl := range resp.GetPlugins() {
			if pl.GetSocketPath() == path {
				return pl
			}
		}
		t.Fatalf("ListPlugins lacks %s", path)
		return nil
	}
	if pl := get(); pl.GetLastError() != "" {
		t.Fatalf("healthy plugin: last error %q", pl.GetLastError())
	}

	// SIGKILL: the plugin stops serving, its socket file stays.
	p.Stop()
	e.dm.SetEndpointState(path, gen, devicemanagerv1.EndpointState_ENDPOINT_STATE_STOPPED)
	var pl *reconcilerv1.Plugin
	testutil.WaitFor(t, "ListPlugins showing the stopped endpoint", func() bool {
		pl = get()
		return pl.GetLastError() != ""
	})
	if pl.GetState() != reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED || pl.GetGeneration() != gen {
		t.Fatalf("plugin = %+v, want still registered with generation %s", pl, gen)
	}
	for _, want := range []string{"device plugin endpoint " + path + " stopped", "example.com/dev", "no allocatable devices"} {
		if !strings.Contains(pl.GetLastError(), want) {
			t.Fatalf("last error %q lacks %q", pl.GetLastError(), want)
		}
	}

	// The devicemanager redials it (say, after its own restart): the note
	// goes.
	e.dm.SetEndpointState(path, gen, devicemanagerv1.EndpointState_ENDPOINT_STATE_LIVE)
	testutil.WaitFor(t, "the note gone once the endpoint is live", func() bool { return get().GetLastError() == "" })

	// Stopped again, then the plugin restarts with a new socket: its new
	// registration has no note.
	e.dm.SetEndpointState(path, gen, devicemanagerv1.EndpointState_ENDPOINT_STATE_STOPPED)
	testutil.WaitFor(t, "the stopped endpoint shown again", func() bool { return get().GetLastError() != "" })
	p2 := e.plugin("dev", devicePlugin("example.com/dev"))
	e.w.Created(t, path)
	st := e.waitState(path, "registered anew", func(s status.PluginStatus) bool {
		return s.State == status.StateRegistered && s.Generation != gen
	})
	if st.LastError != "" {
		t.Fatalf("new registration: last error %q", st.LastError)
	}
	if _, err := p2.WaitStatus(waitCtx(t), testplugin.Registered); err != nil {
		t.Fatal(err)
	}
}
