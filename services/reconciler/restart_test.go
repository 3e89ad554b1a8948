package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/checkpoint"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/handler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

// A reconciler that starts while its peers are still down (an upgrade
// restarts them all) keeps the registrations it adopted: it waits for each
// peer, then registers them with it, and the plugins are never contacted.
func TestRestartWaitsForThePeers(t *testing.T) {
	e := newEnv(t)
	dp := e.plugin("dp", devicePlugin("example.com/dp"))
	dra := e.plugin("dra", draPlugin("dra.example.com"))
	e.createdRegistered(dp, dra)
	e.stop()

	// The peers come back at an address where nothing serves yet.
	later := filepath.Join(e.root, "dm-later.sock")
	e.configure = func(c *config) { c.DeviceManagerAddr, c.DRAManagerAddr = later, later }
	e.start()
	for _, p := range []*testplugin.Plugin{dp, dra} {
		if st, ok := e.status(p.Path()); !ok || st.State != status.StateRegistered {
			t.Fatalf("%s before its peer is up: %+v, want registered (adopted)", p.Path(), st)
		}
	}
	dm := newFakeDM(t, later)
	testutil.WaitFor(t, "both registered with the peer once it serves", func() bool {
		_, dpThere := dm.Endpoints()[dp.Path()]
		_, draThere := dm.DRAInstances()[dra.Path()]
		return dpThere && draThere && len(e.s.drivers.List(handler.TypeDRAPlugin)) == 1
	})
	for _, p := range []*testplugin.Plugin{dp, dra} {
		if calls, sts := p.GetInfoCalls(), p.Statuses(); calls != 1 || len(sts) != 1 {
			t.Errorf("%s was contacted again: %d GetInfo calls, %d notifications; want 1 and 1", p.Path(), calls, len(sts))
		}
		if st, _ := e.status(p.Path()); st.State != status.StateRegistered || st.Name == "" {
			t.Errorf("%s after its peer came: %+v", p.Path(), st)
		}
	}
}

// A registrations file that cannot be read costs only the work it saves:
// every plugin registers again, from GetInfo on, as with the kubelet, and
// the file is written anew.
func TestRestartWithADamagedRegistrationsFile(t *testing.T) {
	e := newEnv(t)
	p := e.plugin("p", devicePlugin("example.com/p"))
	e.w.Created(t, p.Path())
	e.waitRegistered(p.Path())
	e.stop()
	file := filepath.Join(e.root, "registrations.json")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "example.com/p") {
		t.Fatalf("the registrations file does not hold the plugin:\n%s", b)
	}
	// One byte of a registration changed: its checksum no longer matches.
	damaged := strings.Replace(string(b), "example.com/p", "example.com/q", 1)
	if err := os.WriteFile(file, []byte(damaged), 0o600); err != nil {
		t.Fatal(err)
	}
	e.start()
	if _, err := p.WaitStatusAfter(waitCtx(t), 1, testplugin.Registered); err != nil {
		t.Fatalf("no second registration after the damaged file: %v", err)
	}
	if n := p.GetInfoCalls(); n != 2 {
		t.Errorf("GetInfo calls = %d, want 2", n)
	}
	testutil.WaitFor(t, "the registrations file written anew", func() bool {
		f, err := checkpoint.Open(file, checkpoint.Options{})
		return err == nil && slices.ContainsFunc(f.Loaded(), func(r cache.Plugin) bool {
			return r.SocketPath == p.Path() && r.Name == "example.com/p"
		})
	})
}

// The registrations file holds exactly the plugins registered and told so:
// one refused, or gone, is not in it.
func TestRegistrationsFileHoldsTheRegistered(t *testing.T) {
	e := newEnv(t)
	ok := e.plugin("ok", devicePlugin("example.com/ok"))
	gone := e.plugin("gone", draPlugin("dra.example.com"))
	bad := e.plugin("bad", testplugin.Info{Type: "GPUPlugin", Name: "x", Versions: []string{"v1"}})
	e.createdRegistered(ok, gone)
	e.w.Created(t, bad.Path())
	if _, err := bad.WaitStatus(waitCtx(t), testplugin.Rejected); err != nil {
		t.Fatal(err)
	}
	gone.Stop()
	e.w.Deleted(gone.Path())
	e.waitGone(gone.Path())
	file := filepath.Join(e.root, "registrations.json")
	testutil.WaitFor(t, "the registrations file holding only "+ok.Path(), func() bool {
		f, err := checkpoint.Open(file, checkpoint.Options{})
		if err != nil {
			return false
		}
		regs := f.Loaded()
		return len(regs) == 1 && regs[0].SocketPath == ok.Path() && regs[0].Type == "DevicePlugin" &&
			regs[0].Generation == testutil.Generation(t, ok.Path()) && slices.Equal(regs[0].Versions, []string{"v1beta1"})
	})
}
