package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// TestRegistrySocketNamesAreNotURLs: sockets in plugins_registry whose
// names look like URLs ('%2E%2E%2F…', '#', '?') register under their real
// path through the whole stack, and the sockets such names would decode to —
// outside the root, or beside them — are never called.
func TestRegistrySocketNamesAreNotURLs(t *testing.T) {
	e := newEnv(t)
	registry := layout.PluginsRegistryDir(e.root)
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
		// The reconciler shows REGISTERED once Notify has been answered,
		// which can be after the plugin saw it.
		testutil.Eventually(t, names[i]+" listed as registered", func() error {
			pl := e.pluginBySocket(p.Path())
			if pl == nil || pl.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED || pl.GetName() != fmt.Sprintf("real%d.example.com", i) {
				return fmt.Errorf("ListPlugins for %s: %v, want it registered under its real path and name", p.Path(), pl)
			}
			return nil
		})
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

// TestDevicePluginSocketNamesEndToEnd: device plugins whose
// plugins_registry sockets are named with '#', '?', "%41", "%2F", a
// space, or whose path is 107 bytes long, register through the watcher,
// the reconciler and the devicemanager under exactly their path: their
// devices are allocatable, the devicemanager's endpoint and the
// reconciler's entry name the real path. A plugin whose GetInfo endpoint
// is named so that a URL parser would reach a device plugin outside the
// root ("%2E%2E%2F…", or "lnk#x" beside a symlink lnk leading there) is
// refused, and the plugin outside is never called.
func TestDevicePluginSocketNamesEndToEnd(t *testing.T) {
	e := newEnv(t)
	registry := layout.PluginsRegistryDir(e.root)
	dpDir := layout.DevicePluginsDir(e.root)
	long := strings.Repeat("l", unixsock.MaxPathLen-len(registry)-1-len(".sock")) + ".sock"
	if n := len(filepath.Join(registry, long)); n != unixsock.MaxPathLen {
		t.Fatalf("long path of %d bytes", n)
	}
	for i, name := range []string{"d%41.sock", "a#b.sock", "q?x=1.sock", "x%2Fy.sock", "sp ace.sock", long} {
		res := fmt.Sprintf("example.com/odd%d", i)
		p := plugintest.Start(t, sampleplugin.Options{Resource: res, SocketPath: filepath.Join(registry, name), Devices: 2})
		e.waitAllocatable(res, 2)
		r := e.resource(res)
		if eps := r.GetEndpoints(); len(eps) != 1 || eps[0].GetEndpoint() != p.SocketPath() || eps[0].GetSocketPath() != p.SocketPath() {
			t.Errorf("%s: devicemanager endpoints %v, want exactly %q", res, eps, p.SocketPath())
		}
		// The reconciler says REGISTERED once the plugin was told, just
		// after the devicemanager took the endpoint.
		testutil.Eventually(t, res+" registered in the reconciler", func() error {
			if pl := e.pluginBySocket(p.SocketPath()); pl == nil || pl.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED || pl.GetName() != res || pl.GetEndpoint() != p.SocketPath() {
				return fmt.Errorf("reconciler entry %v", pl)
			}
			return nil
		})
	}

	// The victim, outside the root, where "<device-plugins>/../../<name>"
	// leads, and a symlink to it in device-plugins.
	victimName := fmt.Sprintf("npdpvictim%d.sock", time.Now().UnixNano())
	victim, err := sampleplugin.New(sampleplugin.Options{Resource: "example.com/victim", SocketPath: filepath.Join(filepath.Dir(e.root), victimName), Devices: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(victim.Stop)
	if err := os.Symlink(victim.SocketPath(), filepath.Join(dpDir, "lnk")); err != nil {
		t.Fatal(err)
	}
	for i, name := range []string{"%2E%2E%2F%2E%2E%2F" + victimName, "lnk#x"} {
		// A socket file of exactly that name, inside the root, that
		// nothing listens on: dialled by its bytes it refuses.
		endpoint := filepath.Join(dpDir, name)
		if err := stack.StaleSocket(endpoint, true); err != nil {
			t.Fatal(err)
		}
		res := fmt.Sprintf("example.com/escape%d", i)
		p := plugintest.Start(t, sampleplugin.Options{Resource: res, SocketPath: filepath.Join(registry, fmt.Sprintf("escape%d.sock", i)), Endpoint: endpoint, Devices: 2})
		ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
		st, err := p.WaitStatus(ctx, nil)
		cancel()
		if err != nil {
			t.Fatalf("%s: no registration status: %v", name, err)
		}
		if st.Registered {
			t.Errorf("%s: a GetInfo endpoint named %q registered", res, name)
		}
		if r := e.resource(res); r != nil {
			t.Errorf("%s: listed by the devicemanager: %v", res, r)
		}
	}
	if calls := victim.Calls(); len(calls) != 0 {
		t.Errorf("the device plugin outside the root was called: %v", calls)
	}
	if r := e.resource("example.com/victim"); r != nil {
		t.Errorf("the victim's resource is listed: %v", r)
	}
}
