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

// TestRemovedResourceLeavesNoSeries: once a resource is removed (its grace
// period ended), no metric series names it any more, so that the series of
// plugins long gone do not pile up.
func TestRemovedResourceLeavesNoSeries(t *testing.T) {
	const res = "example.com/gone"
	root := testutil.TempDir(t)
	reg := prometheus.NewRegistry()
	m := running(t, root, Config{Registerer: reg, GracePeriod: time.Millisecond})
	series := func() int {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, name := range []string{"kubelet_device_plugin_registration_total", "kubelet_device_plugin_devices"} {
			for _, state := range []string{"", "healthy", "unhealthy"} {
				labels := map[string]string{"resource_name": res}
				if state != "" {
					labels["health_state"] = state
				}
				if testutil.FindMetric(mfs, name, labels) != nil {
					n++
				}
			}
		}
		return n
	}
	p := plugintest.Start(t, sampleplugin.Options{Resource: res, Devices: 1, SocketPath: filepath.Join(root, "plugins_registry", "p.sock")})
	if err := m.Register(ctxT(t), Registration{Resource: res, Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g", Path: PathPluginsRegistry}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, res+" has its series", func() error {
		if n := series(); n == 0 {
			return fmt.Errorf("no series for %s", res)
		}
		return nil
	})
	if ok, err := m.Deregister(ctxT(t), res, p.SocketPath(), "g"); !ok || err != nil {
		t.Fatalf("deregister: %v, %v", ok, err)
	}
	testutil.Eventually(t, res+" removed", func() error {
		if rs := m.ListResources(); len(rs) != 0 {
			return fmt.Errorf("resources %+v", rs)
		}
		return nil
	})
	if n := series(); n != 0 {
		t.Fatalf("%d series still name %s after it was removed", n, res)
	}
}
