package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
)

// pluginByPath returns the reconciler's entry for the socket at path, read
// as a client must: socket_path_bytes when set, else socket_path. It fails
// the test when ListPlugins fails.
func (e *env) pluginByPath(path string) *rcv1.Plugin {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.rc.ListPlugins(ctx, &rcv1.ListPluginsRequest{})
	if err != nil {
		e.t.Fatalf("ListPlugins: %v", err)
	}
	for _, p := range resp.GetPlugins() {
		if got, err := bounds.PathFromWire(p.GetSocketPath(), p.GetSocketPathBytes()); err == nil && got == path {
			return p
		}
	}
	return nil
}

// TestSocketNamesThatAreNotUTF8: sockets in plugins_registry whose names
// are not UTF-8 (any bytes a file name may hold) stop nobody: a normal
// device plugin started after them registers; the watcher's ListSockets,
// the reconciler's ListPlugins and ListDrivers, the devicemanager's
// ListResources and the reconciler's metrics keep answering. Such a socket
// is carried end to end where nodeplug's API can carry it — a DRA driver, a
// device plugin whose GetInfo endpoint is UTF-8 — and the one device plugin
// whose endpoint is that name itself (the devicemanager must dial it, and
// its API holds the endpoint in a proto string) is refused alone, with a
// clear error, to the plugin and in ListPlugins.
func TestSocketNamesThatAreNotUTF8(t *testing.T) {
	e := newEnv(t)
	registry := layout.PluginsRegistryDir(e.root)
	dpDir := layout.DevicePluginsDir(e.root)

	dra := filepath.Join(registry, "bad\xff\xfe.sock")
	draPlugin, err := testplugin.Start(dra, testplugin.Info{Type: registerapi.DRAPlugin, Name: "odd.example.com", Versions: []string{"v1.DRAPlugin"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(draPlugin.Stop)
	// A device plugin listening at an odd name in plugins_registry whose
	// GetInfo endpoint is a UTF-8 symlink to that socket in device-plugins.
	oddReg := filepath.Join(registry, "dp\xfe.sock")
	oddEndpoint := filepath.Join(dpDir, "oddreg.sock")
	if err := os.Symlink(oddReg, oddEndpoint); err != nil {
		t.Fatal(err)
	}
	oddDP := plugintest.Start(t, sampleplugin.Options{Resource: "example.com/oddreg", SocketPath: oddReg, Endpoint: oddEndpoint, Devices: 2})
	// A device plugin whose endpoint is its odd registration socket.
	self := filepath.Join(registry, "self\xc3(.sock")
	selfPlugin, err := testplugin.Start(self, testplugin.Info{Type: registerapi.DevicePlugin, Name: "example.com/self", Versions: []string{pluginapi.Version}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(selfPlugin.Stop)

	normal := e.plugin("normal", "example.com/normal", 3, false)
	e.waitAllocatable("example.com/normal", 3)
	testutil.Eventually(t, "the normal plugin registered in the reconciler", func() error {
		if pl := e.pluginByPath(normal.SocketPath()); pl.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED {
			return fmt.Errorf("reconciler entry %v", pl)
		}
		return nil
	})

	// Carried: the DRA driver and the device plugin with a UTF-8 endpoint.
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	if _, err := draPlugin.WaitStatus(ctx, testplugin.Registered); err != nil {
		t.Fatalf("the DRA driver at %q did not register: %v (statuses %v)", dra, err, draPlugin.Statuses())
	}
	e.waitAllocatable("example.com/oddreg", 2)
	if eps := e.resource("example.com/oddreg").GetEndpoints(); len(eps) != 1 || eps[0].GetEndpoint() != oddEndpoint || eps[0].GetSocketPath() != bounds.PathText(oddReg) {
		t.Errorf("devicemanager endpoints of example.com/oddreg: %v, want %q registered from %s", eps, oddEndpoint, bounds.PathText(oddReg))
	}
	testutil.Eventually(t, "the odd sockets' entries in the reconciler", func() error {
		for path, name := range map[string]string{dra: "odd.example.com", oddReg: "example.com/oddreg"} {
			pl := e.pluginByPath(path)
			if pl.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED || pl.GetName() != name || pl.GetSocketPath() != bounds.PathText(path) {
				return fmt.Errorf("entry for %q: %v", path, pl)
			}
		}
		return nil
	})
	drivers, err := e.rc.ListDrivers(ctx, &rcv1.ListDriversRequest{})
	if err != nil {
		t.Fatalf("ListDrivers: %v", err)
	}
	if ds := drivers.GetDraDrivers(); len(ds) != 1 || ds[0].GetSocketPath() != bounds.PathText(dra) || ds[0].GetEndpoint() != bounds.PathText(dra) {
		t.Errorf("DRA drivers %v, want the one at %s", ds, bounds.PathText(dra))
	}

	// Refused alone: the device plugin whose endpoint is its odd name.
	st, err := selfPlugin.WaitStatus(ctx, nil)
	if err != nil {
		t.Fatalf("no registration status for %q: %v", self, err)
	}
	if st.Registered || !strings.Contains(st.Error, "not valid UTF-8") {
		t.Errorf("the plugin at %q was told %+v, want a refusal saying its endpoint is not UTF-8", self, st)
	}
	testutil.Eventually(t, "the refused plugin listed as failed", func() error {
		pl := e.pluginByPath(self)
		if pl.GetState() != rcv1.PluginState_PLUGIN_STATE_FAILED || !strings.Contains(pl.GetLastError(), "not valid UTF-8") ||
			string(pl.GetSocketPathBytes()) != self {
			return fmt.Errorf("entry for %q: %v", self, pl)
		}
		return nil
	})
	if r := e.resource("example.com/self"); r != nil {
		t.Errorf("the refused plugin's resource is listed: %v", r)
	}

	// The watcher lists every socket, the odd ones quoted and as bytes.
	wconn, err := rpcutil.DialPeer(e.st.Addr("watcher"))
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Close()
	list, err := watcherv1.NewWatcherServiceClient(wconn).ListSockets(ctx, &watcherv1.ListSocketsRequest{})
	if err != nil {
		t.Fatalf("ListSockets: %v", err)
	}
	seen := map[string]bool{}
	for _, s := range list.GetSockets() {
		p, err := bounds.PathFromWire(s.GetPath(), s.GetPathBytes())
		if err != nil {
			t.Fatal(err)
		}
		seen[p] = true
	}
	for _, p := range []string{dra, oddReg, self, normal.SocketPath()} {
		if !seen[p] {
			t.Errorf("ListSockets lacks %q: %v", p, list.GetSockets())
		}
	}

	// The reconciler's metrics name every socket, the odd ones quoted.
	labels := scrape(t, e, "reconciler", "plugin_manager_total_plugins{")
	for _, p := range []string{dra, oddReg, self} {
		if !strings.Contains(labels, fmt.Sprintf("socket_path=%q", bounds.PathText(p))) {
			t.Errorf("plugin_manager_total_plugins lacks %s:\n%s", bounds.PathText(p), labels)
		}
	}
	if calls := oddDP.Calls(); len(calls) == 0 {
		t.Errorf("the device plugin behind %q was never called", oddEndpoint)
	}
}

// scrape returns the lines of a service's /metrics that start with prefix.
func scrape(t *testing.T, e *env, service, prefix string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, err := e.st.Process(service).Addr(ctx, "metrics listening")
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("scraping the %s: %v", service, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("scraping the %s: %s", service, resp.Status)
	}
	var out strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if strings.HasPrefix(sc.Text(), prefix) {
			out.WriteString(sc.Text() + "\n")
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out.String()
}
