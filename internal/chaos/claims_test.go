package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// TestChaosClaims is the claims phase alone: clients preparing and
// releasing DRA claims (shared ones too) through real processes while the
// devicemanager is SIGKILLed, with (g)–(j) checked. It asserts no timing.
func TestChaosClaims(t *testing.T) {
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := stack.Build(ctx, dir, "nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager", "nodeplug-apiserver"); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Bin: dir, Plugins: 2, Devices: 2, Clients: 1, Interval: 300 * time.Millisecond,
		CompactBytes: 16 << 10, ClaimWorkers: 3, ClaimKills: 5, Converge: 2 * time.Minute, Progress: logWriter{t}}
	res, err := Run(ctx, cfg)
	if res != nil {
		var b strings.Builder
		Print(&b, res)
		t.Logf("\n%s", b.String())
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Violations {
		t.Errorf("violation %s", v)
	}
	c := res.Claims
	if c.Workers != cfg.ClaimWorkers || c.Kills != cfg.ClaimKills || c.Prepares == 0 || c.Releases == 0 || c.Shared == 0 ||
		c.DriverPrepares == 0 || c.DriverUnprepares == 0 || c.Checks <= cfg.ClaimKills {
		t.Errorf("claims phase: %+v, want %d clients, %d kills, prepares and releases (shared claims too) acknowledged, driver calls, a check after each kill and at the end",
			c, cfg.ClaimWorkers, cfg.ClaimKills)
	}
}
