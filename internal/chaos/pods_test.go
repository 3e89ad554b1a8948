package chaos

import (
	"testing"
	"time"
)

// TestChaosPods is the pods phase alone: clients creating Pods whose claim
// comes from a ResourceClaimTemplate, and deleting them, through real
// processes while the dramanager and nodeplug-apiserver are SIGKILLed in
// turn, with (g), (i), (j), (m) and (n) checked. It asserts no timing.
func TestChaosPods(t *testing.T) {
	cfg := Config{Plugins: 2, Devices: 2, Clients: 1, Interval: 300 * time.Millisecond,
		CompactBytes: 16 << 10, PodWorkers: 2, PodKills: 4, Converge: 2 * time.Minute}
	res := runChaos(t, cfg)
	p := res.Pods
	if p.Workers != cfg.PodWorkers || p.Kills != cfg.PodKills || p.Run < cfg.PodKills || p.Deleted == 0 ||
		p.DriverPrepares == 0 || p.DriverUnprepares == 0 {
		t.Errorf("pods phase: %+v, want %d clients, %d kills, a pod run before each, pods deleted, driver calls",
			p, cfg.PodWorkers, cfg.PodKills)
	}
}
