package main

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

// TestSocketNamesNotUTF8: registration sockets whose names are not UTF-8,
// as the watcher reports them (quoted, with path_bytes), beside normal
// ones: the reconciler registers them under their real paths (a device
// plugin with its socket path quoted to the devicemanager), refuses alone
// the device plugin whose endpoint is such a name, answers ListPlugins,
// and after a restart keeps the odd device plugin's registration while it
// sweeps a vanished one.
func TestSocketNamesNotUTF8(t *testing.T) {
	e := newEnv(t)
	endpoint := filepath.Join(e.root, "odd-endpoint.sock")
	l, err := net.Listen("unix", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	oddDP := e.plugin("dp\xff\xfe", testplugin.Info{Type: "DevicePlugin", Name: "example.com/odd", Endpoint: endpoint, Versions: []string{"v1beta1"}})
	oddDRA := e.plugin("dra\xfe", draPlugin("odd.example.com"))
	self := e.plugin("self\xc3(", devicePlugin("example.com/self"))
	normal := e.plugin("normal", devicePlugin("example.com/normal"))
	gone := e.plugin("gone", devicePlugin("example.com/zzz"))
	for _, p := range []*testplugin.Plugin{oddDP, oddDRA, self, normal, gone} {
		e.w.Created(t, p.Path())
	}
	for _, p := range []*testplugin.Plugin{oddDP, oddDRA, normal, gone} {
		e.waitRegistered(p.Path())
	}
	st := e.waitState(self.Path(), "refused", func(s status.PluginStatus) bool { return s.State == status.StateFailed })
	if !strings.Contains(st.LastError, "not valid UTF-8") {
		t.Errorf("refusal of %q: %q, want it to say the endpoint is not UTF-8", self.Path(), st.LastError)
	}
	if ep := e.dm.Endpoints()[endpoint]; ep.socketPath != bounds.PathText(oddDP.Path()) {
		t.Errorf("devicemanager got socket path %q, want %q", ep.socketPath, bounds.PathText(oddDP.Path()))
	}

	resp, err := serviceClient(t, e).ListPlugins(waitCtx(t), &reconcilerv1.ListPluginsRequest{})
	if err != nil {
		t.Fatalf("ListPlugins: %v", err)
	}
	listed := map[string]reconcilerv1.PluginState{}
	for _, p := range resp.GetPlugins() {
		path, err := bounds.PathFromWire(p.GetSocketPath(), p.GetSocketPathBytes())
		if err != nil {
			t.Fatal(err)
		}
		listed[path] = p.GetState()
	}
	for p, want := range map[string]reconcilerv1.PluginState{oddDP.Path(): reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED,
		oddDRA.Path(): reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED, normal.Path(): reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED,
		self.Path(): reconcilerv1.PluginState_PLUGIN_STATE_FAILED} {
		if listed[p] != want {
			t.Errorf("ListPlugins: %q is %v, want %v (all: %v)", p, listed[p], want, listed)
		}
	}

	// Restart: the vanished plugin's registration is swept; the odd one,
	// whose socket is still there, stays (the devicemanager lists it
	// quoted, resources in name order: example.com/odd before
	// example.com/zzz).
	e.stop()
	gone.Stop()
	e.w.Deleted(gone.Path())
	e.start()
	e.waitRegistered(oddDP.Path())
	testutil.WaitFor(t, "the vanished plugin's registration swept", func() bool {
		_, ok := e.dm.Endpoints()[gone.Path()]
		return !ok
	})
	for _, call := range e.dm.Calls() {
		if strings.HasPrefix(call, "deregister "+endpoint) {
			t.Fatalf("the odd plugin's registration was swept: %v", e.dm.Calls())
		}
	}
}
