package manager

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
)

// TestGiveBackAfterArrivalsAndDepartures: with Run going, a burst of
// registrations, once settled, makes the manager give memory back (counted
// in its metric), and so does the burst of their deregistrations; the
// manager works as before after it.
func TestGiveBackAfterArrivalsAndDepartures(t *testing.T) {
	const plugins = 4
	root := testutil.TempDir(t)
	reg := prometheus.NewRegistry()
	m := running(t, root, Config{Registerer: reg, GiveBack: GiveBack{MinChanges: plugins, Quiet: time.Millisecond, Interval: time.Millisecond}})
	givenBack := func(want float64) func() error {
		return func() error {
			mfs, err := reg.Gather()
			if err != nil {
				return err
			}
			got, _ := testutil.MetricValue(testutil.FindMetric(mfs, "nodeplug_devicemanager_memory_give_backs_total", nil))
			if got < want {
				return fmt.Errorf("%v give-backs, want %v", got, want)
			}
			return nil
		}
	}

	var ps []*sampleplugin.Plugin
	for i := range plugins {
		p := plugintest.Start(t, sampleplugin.Options{
			Resource: fmt.Sprintf("example.com/gb%d", i), Devices: 1,
			SocketPath: filepath.Join(root, "plugins_registry", fmt.Sprintf("p%d.sock", i)),
		})
		if err := m.Register(ctxT(t), Registration{Resource: p.Resource(), Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g", Path: PathPluginsRegistry}); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	testutil.Eventually(t, "memory given back after the arrivals", givenBack(1))

	for _, p := range ps {
		if ok, err := m.Deregister(ctxT(t), p.Resource(), p.SocketPath(), "g"); !ok || err != nil {
			t.Fatalf("deregister %s: %v, %v", p.Resource(), ok, err)
		}
	}
	testutil.Eventually(t, "memory given back after the departures", givenBack(2))

	// The maps rebuilt by the give-back still hold every resource.
	if rs := m.ListResources(); len(rs) != plugins {
		t.Fatalf("resources after the give-backs: %+v", rs)
	}
	if err := m.Register(ctxT(t), Registration{Resource: ps[0].Resource(), Endpoint: ps[0].SocketPath(), Versions: []string{"v1beta1"}, Generation: "g2", Path: PathPluginsRegistry}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, ps[0].Resource()+" allocatable again", func() error {
		for _, r := range m.ListResources() {
			if r.Name == ps[0].Resource() && r.Allocatable == 1 {
				return nil
			}
		}
		return fmt.Errorf("resources %+v", m.ListResources())
	})
}
