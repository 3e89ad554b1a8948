package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
)

// TestRegistrySocketNamesAreNotURLs: sockets in plugins_registry whose
// names look like URLs ('%2E%2E%2F…', '#', '?') register under their real
// path through the whole stack, and the sockets such names would decode to —
// outside the root, or beside them — are never called.
func TestRegistrySocketNamesAreNotURLs(t *testing.T) {
	e := newEnv(t)
	registry := app.PluginsRegistryDir(e.root)
	// A victim outside the root, where "<registry>/../../<name>" leads.
	outside := filepath.Dir(e.root)
	victimName := fmt.Sprintf("npvictim%d.sock", time.Now().UnixNano())
	victim, err := testplugin.Start(filepath.Join(outside, victimName), testplugin.Info{Type: registerapi.DRAPlugin, Name: "victim.example.com", Versions: []string{"v1.DRAPlugin"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(victim.Stop)
	// A decoy beside the sockets, named as '#' or '?' would cut them, and a
	// symlink to the victim (not followed by the watcher: it leads outside).
	decoy, err := testplugin.Start(filepath.Join(registry, "q"), testplugin.Info{Type: registerapi.DRAPlugin, Name: "decoy.example.com", Versions: []string{"v1.DRAPlugin"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(decoy.Stop)
	if err := os.Symlink(victim.Path(), filepath.Join(registry, "lnk")); err != nil {
		t.Fatal(err)
	}

	names := []string{"%2E%2E%2F%2E%2E%2F" + victimName, "lnk#x.sock", "q?x=1.sock", "d%41.sock"}
	var plugins []*testplugin.Plugin
	for i, n := range names {
		p, err := testplugin.Start(filepath.Join(registry, n), testplugin.Info{Type: registerapi.DRAPlugin,
			Name: fmt.Sprintf("real%d.example.com", i), Versions: []string{"v1.DRAPlugin"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		plugins = append(plugins, p)
	}
	for i, p := range plugins {
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
		if _, err := p.WaitStatus(ctx, testplugin.Registered); err != nil {
			t.Fatalf("%s did not register: %v (statuses %v)", names[i], err, p.Statuses())
		}
		cancel()
		pl := e.pluginBySocket(p.Path())
		if pl == nil || pl.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED || pl.GetName() != fmt.Sprintf("real%d.example.com", i) {
			t.Errorf("ListPlugins for %s: %v, want it registered under its real path and name", p.Path(), pl)
		}
	}
	if n := victim.GetInfoCalls(); n != 0 {
		t.Errorf("the socket outside the root got %d GetInfo calls", n)
	}
	// The decoy is a socket of its own in the registry: it registers for
	// itself, once — never in place of "q?x=1.sock".
	if pl := e.pluginBySocket(filepath.Join(registry, "q")); pl != nil && pl.GetName() != "decoy.example.com" {
		t.Errorf("the decoy's socket is listed as %q", pl.GetName())
	}
	if pl := e.pluginBySocket(filepath.Join(registry, "lnk")); pl != nil {
		t.Errorf("the symlink leading outside the root is listed: %v", pl)
	}
}
