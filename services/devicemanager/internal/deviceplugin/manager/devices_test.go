package manager

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// TestListDevices: each device with the health and the NUMA nodes its
// plugin reported, sorted; a health change shows at once; a stopped
// endpoint leaves its devices listed, unhealthy, for the grace period.
func TestListDevices(t *testing.T) {
	root := testutil.TempDir(t)
	dpDir := filepath.Join(root, "device-plugins")
	m, err := Open(ctxT(t), Config{DevicePluginsDir: dpDir, AllowedDirs: []string{root}, Store: store.New(dpDir, store.Options{}), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	const res = "example.com/numa"
	p, err := sampleplugin.New(sampleplugin.Options{
		Resource: res, DeviceIDs: []string{"b", "a", "c"}, NUMANodes: map[string][]int64{"a": {1}, "c": {0, 1}},
		SocketPath: filepath.Join(root, "plugins_registry", "p.sock"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	if err := m.Register(ctxT(t), Registration{Resource: res, Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g", Path: PathPluginsRegistry}); err != nil {
		t.Fatal(err)
	}
	want := func(healthy ...bool) []ResourceDevices {
		return []ResourceDevices{{Name: res, Devices: []DeviceInfo{
			{ID: "a", Healthy: healthy[0], NUMANodes: []int64{1}},
			{ID: "b", Healthy: healthy[1]},
			{ID: "c", Healthy: healthy[2], NUMANodes: []int64{0, 1}},
		}}}
	}
	wait := func(what string, w []ResourceDevices) {
		t.Helper()
		testutil.Eventually(t, what, func() error {
			if got := m.ListDevices(); !slices.EqualFunc(got, w, func(a, b ResourceDevices) bool {
				return a.Name == b.Name && slices.EqualFunc(a.Devices, b.Devices, func(x, y DeviceInfo) bool {
					return x.ID == y.ID && x.Healthy == y.Healthy && slices.Equal(x.NUMANodes, y.NUMANodes)
				})
			}) {
				return fmt.Errorf("got %+v", got)
			}
			return nil
		})
	}
	wait("all healthy", want(true, true, true))
	if err := p.SetHealth("c", false); err != nil {
		t.Fatal(err)
	}
	wait("c unhealthy", want(true, true, false))
	// The view is the caller's: changing it changes nothing inside.
	m.ListDevices()[0].Devices[2].NUMANodes[0] = 7
	wait("c unhealthy, view unchanged", want(true, true, false))
	p.Stop()
	wait("stopped: every device unhealthy, still listed", want(false, false, false))
}
