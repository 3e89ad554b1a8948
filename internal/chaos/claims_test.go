package chaos

import (
	"testing"
	"time"
)

// TestChaosClaims is the claims phase alone: clients preparing and
// releasing DRA claims (shared ones too) through real processes while the
// devicemanager is SIGKILLed, with (g)–(j) checked. It asserts no timing.
func TestChaosClaims(t *testing.T) {
	cfg := Config{Plugins: 2, Devices: 2, Clients: 1, Interval: 300 * time.Millisecond,
		CompactBytes: 16 << 10, ClaimWorkers: 3, ClaimKills: 5, Converge: 2 * time.Minute}
	res := runChaos(t, cfg)
	c := res.Claims
	if c.Workers != cfg.ClaimWorkers || c.Kills != cfg.ClaimKills || c.Prepares == 0 || c.Releases == 0 || c.Shared == 0 ||
		c.DriverPrepares == 0 || c.DriverUnprepares == 0 || c.Checks <= cfg.ClaimKills {
		t.Errorf("claims phase: %+v, want %d clients, %d kills, prepares and releases (shared claims too) acknowledged, driver calls, a check after each kill and at the end",
			c, cfg.ClaimWorkers, cfg.ClaimKills)
	}
}
