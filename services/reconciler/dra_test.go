package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/handler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

// draPluginAt is a DRA driver whose DRA service is at endpoint.
func draPluginAt(name, endpoint string) testplugin.Info {
	info := draPlugin(name)
	info.Endpoint = endpoint
	return info
}

// endpoint returns the path of a DRA driver's service socket named name in
// the plugins directory, where the kubelet's plugins put them, and creates
// the socket there unless it exists (the fake devicemanager dials nothing,
// but refuses an endpoint with no file as the real one does).
func (e *env) endpoint(name string) string {
	e.t.Helper()
	path := filepath.Join(layout.PluginsDir(e.root), name+".sock")
	if _, err := os.Lstat(path); err == nil {
		return path
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		e.t.Fatal(err)
	}
	testutil.StaleSocket(e.t, path)
	return path
}

// The DRA handler hands each driver to the devicemanager: RegisterDRADriver
// with the driver name, its endpoint, the services GetInfo offered, its
// registration socket and generation, before the plugin is told it
// registered; DeregisterDRADriver of that generation when the socket goes.
func TestDRADriverHandedToDeviceManager(t *testing.T) {
	e := newEnv(t)
	info := draPlugin("dra.example.com")
	info.Versions = []string{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"}
	p := e.plugin("dra", info)
	e.w.Created(t, p.Path())
	if _, err := p.WaitStatus(waitCtx(t), testplugin.Registered); err != nil {
		t.Fatal(err)
	}
	gen := testutil.Generation(t, p.Path())
	// Registered before it was told so.
	in, ok := e.dm.DRAInstances()[p.Path()]
	if !ok || in.driver != "dra.example.com" || in.socketPath != p.Path() || in.generation != gen || !slices.Equal(in.services, info.Versions) {
		t.Fatalf("devicemanager DRA instances = %+v, want %s with generation %s and services %v", e.dm.DRAInstances(), p.Path(), gen, info.Versions)
	}
	e.waitRegistered(p.Path())
	if d := e.s.drivers.List(handler.TypeDRAPlugin); len(d) != 1 || d[0].Generation != gen {
		t.Fatalf("DRA drivers = %+v", d)
	}

	p.Stop()
	e.w.Deleted(p.Path())
	e.waitGone(p.Path())
	testutil.WaitFor(t, "DRA instance deregistered", func() bool { return len(e.dm.DRAInstances()) == 0 })
	want := []string{"register dra.example.com " + p.Path() + " " + gen, "deregister dra.example.com " + p.Path() + " " + gen}
	if got := e.dm.DRACalls(); !slices.Equal(got, want) {
		t.Fatalf("DRAService calls %q, want %q", got, want)
	}
	if n := len(e.dm.Calls()); n != 0 {
		t.Fatalf("DeviceManagerService got %d calls for a DRA driver", n)
	}
}

// As in the kubelet, several instances of one driver register at once
// (the helper's rolling update: distinct registration sockets and
// endpoints, one driver name), and removing one leaves the others. An
// instance naming an endpoint that another instance of the driver holds is
// refused in the kubelet's words, without reaching the devicemanager.
func TestDRADriverInstances(t *testing.T) {
	e := newEnv(t)
	ep1, ep2 := e.endpoint("ep1"), e.endpoint("ep2")
	a := e.plugin("a", draPluginAt("dra.example.com", ep1))
	b := e.plugin("b", draPluginAt("dra.example.com", ep2))
	for _, p := range []*testplugin.Plugin{a, b} {
		e.w.Created(t, p.Path())
		if _, err := p.WaitStatus(waitCtx(t), testplugin.Registered); err != nil {
			t.Fatal(err)
		}
	}
	ins := e.dm.DRAInstances()
	if len(ins) != 2 || ins[ep1].socketPath != a.Path() || ins[ep2].socketPath != b.Path() {
		t.Fatalf("devicemanager DRA instances = %+v, want both", ins)
	}
	if d := e.s.drivers.List(handler.TypeDRAPlugin); len(d) != 2 || d[0].Name != d[1].Name {
		t.Fatalf("DRA drivers = %+v, want two instances of one driver", d)
	}

	calls := len(e.dm.DRACalls())
	hijack := e.plugin("c", draPluginAt("dra.example.com", ep1))
	e.w.Created(t, hijack.Path())
	got, err := hijack.WaitStatus(waitCtx(t), testplugin.Rejected)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("RegisterPlugin error -- plugin registration failed with err: endpoint %s already registered for DRA driver plugin dra.example.com", ep1); got.Error != want {
		t.Fatalf("reason %q, want %q", got.Error, want)
	}
	if st := e.waitFailed(hijack.Path(), 1); !strings.Contains(st.LastError, a.Path()) {
		t.Fatalf("last error %q does not name the socket holding the endpoint (%s)", st.LastError, a.Path())
	}
	if n := len(e.dm.DRACalls()); n != calls {
		t.Fatalf("the refused instance reached the devicemanager: %q", e.dm.DRACalls()[calls:])
	}

	// The first instance goes (the old pod of a rolling update): the
	// second stays registered, downstream too.
	a.Stop()
	e.w.Deleted(a.Path())
	e.waitGone(a.Path())
	testutil.WaitFor(t, "first instance deregistered", func() bool { _, ok := e.dm.DRAInstances()[ep1]; return !ok })
	if in, ok := e.dm.DRAInstances()[ep2]; !ok || in.socketPath != b.Path() {
		t.Fatalf("second instance gone downstream: %+v", e.dm.DRAInstances())
	}
	if s, _ := e.status(b.Path()); s.State != status.StateRegistered {
		t.Fatalf("second instance %+v", s)
	}
	// Its endpoint is free now: the refused instance registers on its
	// retry.
	e.advanceBackoff()
	e.waitRegistered(hijack.Path())
	if in := e.dm.DRAInstances()[ep1]; in.socketPath != hijack.Path() {
		t.Fatalf("endpoint %s held by %+v after the retry", ep1, in)
	}
}

// A recreated registration socket is registered with its new generation in
// place of the old one: the devicemanager replaces the instance of the same
// endpoint without a deregistration; a new endpoint is a new instance, and
// the old one is deregistered once the new one is registered.
func TestDRARecreatedSocket(t *testing.T) {
	for _, tc := range []struct {
		name      string
		second    string // the recreated plugin's endpoint file name
		wantDereg bool
	}{
		{name: "same endpoint", second: "ep1"},
		{name: "new endpoint", second: "ep2", wantDereg: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			ep1, ep2 := e.endpoint("ep1"), e.endpoint(tc.second)
			p := e.plugin("dra", draPluginAt("dra.example.com", ep1))
			e.w.Created(t, p.Path())
			old := e.waitRegistered(p.Path()).Generation
			p.Stop()
			p2 := e.plugin("dra", draPluginAt("dra.example.com", ep2))
			e.w.Created(t, p2.Path())
			if _, err := p2.WaitStatus(waitCtx(t), testplugin.Registered); err != nil {
				t.Fatal(err)
			}
			cur := e.waitRegistered(p.Path()).Generation
			if cur == old {
				t.Fatal("generation did not change on recreation")
			}
			want := []string{"register dra.example.com " + ep1 + " " + old, "register dra.example.com " + ep2 + " " + cur}
			if tc.wantDereg {
				want = append(want, "deregister dra.example.com "+ep1+" "+old)
			}
			testutil.WaitFor(t, "the old instance deregistered, if it must", func() bool { return len(e.dm.DRACalls()) >= len(want) })
			if got := e.dm.DRACalls(); !slices.Equal(got, want) {
				t.Fatalf("DRAService calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if ins := e.dm.DRAInstances(); len(ins) != 1 || ins[ep2].generation != cur {
				t.Fatalf("devicemanager DRA instances = %+v", ins)
			}
			if d := e.s.drivers.List(handler.TypeDRAPlugin); len(d) != 1 || d[0].Generation != cur || d[0].Endpoint != ep2 {
				t.Fatalf("DRA drivers = %+v", d)
			}
		})
	}
}

// A devicemanager that refuses or cannot be reached fails a DRA driver's
// registration as it fails a device plugin's: the plugin is told, the
// socket backs off, nothing is recorded; the retry registers once the
// devicemanager answers. The kubelet's words the devicemanager sends reach
// the plugin.
func TestDRADeviceManagerFailure(t *testing.T) {
	t.Run("refused", func(t *testing.T) {
		e := newEnv(t)
		e.dm.SetDRARegisterError(grpcstatus.Error(codes.Unavailable, "devicemanager is shutting down"))
		p := e.plugin("dra", draPlugin("dra.example.com"))
		e.w.Created(t, p.Path())
		got, err := p.WaitStatus(waitCtx(t), testplugin.Rejected)
		if err != nil {
			t.Fatal(err)
		}
		const prefix = "RegisterPlugin error -- plugin registration failed with err: dramanager RegisterDRADriver for DRA driver dra.example.com"
		if !strings.HasPrefix(got.Error, prefix) || !strings.Contains(got.Error, "devicemanager is shutting down") || strings.HasSuffix(got.Error, ": unavailable") {
			t.Fatalf("reason %q, want %q… with the devicemanager's message and no errdefs suffix", got.Error, prefix)
		}
		st := e.waitFailed(p.Path(), 1)
		if want := e.clk.Now().Add(executor.InitialBackoff); !st.NextRetry.Equal(want) {
			t.Fatalf("next retry %v, want %v", st.NextRetry, want)
		}
		if _, ok := e.s.loop.ASW().Get(p.Path()); ok || len(e.s.drivers.List(handler.TypeDRAPlugin)) != 0 {
			t.Fatal("a refused DRA driver is recorded")
		}
		e.dm.SetDRARegisterError(nil)
		e.advanceBackoff()
		e.waitRegistered(p.Path())
		if _, ok := e.dm.DRAInstances()[p.Path()]; !ok {
			t.Fatalf("devicemanager DRA instances = %+v after the retry", e.dm.DRAInstances())
		}
	})

	t.Run("unreachable", func(t *testing.T) {
		var dmAddr string
		e := newEnvWith(t, func(c *config) {
			c.DRAManagerAddr = c.DeviceManagerAddr + ".later"
			dmAddr = c.DRAManagerAddr
		})
		p := e.plugin("dra", draPlugin("dra.example.com"))
		e.w.Created(t, p.Path())
		got, err := p.WaitStatus(waitCtx(t), testplugin.Rejected)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(got.Error, "dramanager RegisterDRADriver for DRA driver dra.example.com") {
			t.Fatalf("reason %q does not name the failed call", got.Error)
		}
		e.waitFailed(p.Path(), 1)
		dm := newFakeDM(t, dmAddr)
		// Each retry comes at the end of its backoff; the devicemanager's
		// connection comes up within gRPC's own reconnect backoff.
		testutil.Eventually(t, "registered once the devicemanager answers", func() error {
			st, _ := e.status(p.Path())
			if st.State == status.StateRegistered {
				return nil
			}
			if st.State == status.StateFailed && e.clk.Due(executor.Delay(st.Failures)) > 0 {
				e.clk.Advance(executor.Delay(st.Failures))
			}
			return fmt.Errorf("%v after %d failures: %s", st.State, st.Failures, st.LastError)
		})
		if _, ok := dm.DRAInstances()[p.Path()]; !ok {
			t.Fatalf("devicemanager DRA instances = %+v", dm.DRAInstances())
		}
	})
}

// A devicemanager restart (new instance ID) makes every DRA driver register
// with it again, without the plugin being contacted.
func TestDRADeviceManagerRestartReregisters(t *testing.T) {
	e := newEnv(t)
	a := e.plugin("a", draPluginAt("dra.example.com", e.endpoint("ep-a")))
	b := e.plugin("b", draPluginAt("dra.example.com", e.endpoint("ep-b")))
	e.createdRegistered(a, b)
	want := e.dm.DRAInstances()
	testutil.WaitFor(t, "devicemanager instance known", func() bool { return e.s.dm.Instance() != "" })
	e.dm.Restart()
	testutil.WaitFor(t, "DRA instances registered again", func() bool {
		got := e.dm.DRAInstances()
		return len(got) == 2 && fmt.Sprint(got) == fmt.Sprint(want)
	})
	for _, p := range []*testplugin.Plugin{a, b} {
		if n, calls := len(p.Statuses()), p.GetInfoCalls(); n != 1 || calls != 1 {
			t.Fatalf("%s: %d notifications, %d GetInfo calls; want 1 and 1", p.Path(), n, calls)
		}
	}
}

// A reconciler restart registers its DRA drivers again (a no-op
// downstream; the plugin is not contacted) and deregisters the instances
// whose sockets went while it was down, or that it never knew: an earlier
// reconciler's.
func TestDRAReconcilerRestartSweepsOrphans(t *testing.T) {
	e := newEnv(t)
	keep := e.plugin("keep", draPlugin("dra.example.com"))
	gone := e.plugin("gone", draPlugin("dra2.example.com"))
	e.createdRegistered(keep, gone)
	e.stop()
	gone.Stop()
	e.w.Deleted(gone.Path())
	stranger := draInstance{driver: "dra3.example.com", endpoint: e.endpoint("stranger"), socketPath: e.sock("stranger"), generation: "1:2:3", services: []string{"v1.DRAPlugin"}}
	e.dm.AddDRAInstance(stranger)
	e.start()
	e.waitRegistered(keep.Path())
	testutil.WaitFor(t, "orphans swept", func() bool {
		ins := e.dm.DRAInstances()
		_, hasGone := ins[gone.Path()]
		_, hasStranger := ins[stranger.endpoint]
		return !hasGone && !hasStranger
	})
	if _, ok := e.dm.DRAInstances()[keep.Path()]; !ok {
		t.Fatalf("the desired instance was swept: %+v", e.dm.DRAInstances())
	}
	for _, c := range e.dm.DRACalls() {
		if strings.HasPrefix(c, "deregister dra.example.com ") {
			t.Fatalf("the desired instance was deregistered: %q", e.dm.DRACalls())
		}
	}
	// The adopted driver's record is rebuilt when it is registered with
	// the dramanager again, once the dramanager's watch stream is open.
	testutil.WaitFor(t, "the DRA driver's record rebuilt after the restart", func() bool {
		d := e.s.drivers.List(handler.TypeDRAPlugin)
		return len(d) == 1 && d[0].SocketPath == keep.Path()
	})
}

// A DRA driver's endpoint is not waited for, as the kubelet does not wait
// for it (only a device plugin's is): one that does not exist yet fails the
// registration at once, refused by the devicemanager, which cannot dial
// it; the socket backs off, and its retry registers once the endpoint
// exists.
func TestDRAEndpointNotYetThere(t *testing.T) {
	e := newEnv(t)
	ep := filepath.Join(layout.PluginsDir(e.root), "later.sock")
	p := e.plugin("dra", draPluginAt("dra.example.com", ep))
	e.w.Created(t, p.Path())
	got, err := p.WaitStatus(waitCtx(t), testplugin.Rejected)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got.Error, "RegisterPlugin error -- plugin registration failed with err: dramanager RegisterDRADriver for DRA driver dra.example.com at "+ep) {
		t.Fatalf("reason %q", got.Error)
	}
	e.waitFailed(p.Path(), 1)
	if e.endpoint("later") != ep {
		t.Fatal("endpoint path changed")
	}
	e.advanceBackoff()
	e.waitRegistered(p.Path())
	if in, ok := e.dm.DRAInstances()[ep]; !ok || in.socketPath != p.Path() {
		t.Fatalf("devicemanager DRA instances = %+v", e.dm.DRAInstances())
	}
}
