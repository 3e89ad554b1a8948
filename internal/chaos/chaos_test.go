package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// logWriter sends progress lines to the test log.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// runChaos builds the binaries, runs cfg over them with its progress in
// the test log, logs the report, and fails the test on an error (fatally)
// or on any violation.
func runChaos(t *testing.T, cfg Config) *Results {
	t.Helper()
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := stack.Build(ctx, dir, "nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager", "nodeplug-dramanager", "nodeplug-apiserver"); err != nil {
		t.Fatal(err)
	}
	cfg.Bin = dir
	cfg.Progress = logWriter{t}
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
	return res
}

// TestChaosShort is the short form of `make chaos` over freshly built
// binaries: a few SIGKILLs under load, a few devicemanager kills mid-burst
// and during checkpoint compactions, dramanager kills while DRA drivers
// publish ResourceSlices, and each kind of damage to the
// snapshot and the journal, with every invariant checked after
// each restart. Every wait in it is for a state, with a generous deadline;
// it asserts no timing.
func TestChaosShort(t *testing.T) {
	cfg := Short()
	res := runChaos(t, cfg)
	kills := 0
	for _, n := range res.Kills {
		kills += n
	}
	if want := cfg.Kills + cfg.Bursts + cfg.CompactionKills; kills < want {
		t.Errorf("%d kills, want at least %d", kills, want)
	}
	if res.BurstKills != cfg.Bursts {
		t.Errorf("%d kills mid-burst, want %d", res.BurstKills, cfg.Bursts)
	}
	if res.CompactionKills < cfg.CompactionKills || res.CompactionAimed != cfg.CompactionKills || res.CompactionLanded == 0 {
		t.Errorf("compaction phase: %d kills, %d aimed, %d landed during a compaction; want at least %d kills, %d aimed, at least one landed",
			res.CompactionKills, res.CompactionAimed, res.CompactionLanded, cfg.CompactionKills, cfg.CompactionKills)
	}
	if res.Acked == 0 || res.Checks < cfg.Kills+cfg.Bursts {
		t.Errorf("the load or the checks did not run: %d acknowledged, %d checks", res.Acked, res.Checks)
	}
	if res.DRA.Drivers != cfg.DRADrivers || res.DRA.Kills != cfg.DRAKills || res.DRA.Acked == 0 || res.DRA.Checks < cfg.DRAKills {
		t.Errorf("DRA phase: %+v, want %d drivers, %d kills, acknowledged writes and a check after each kill", res.DRA, cfg.DRADrivers, cfg.DRAKills)
	}
	if len(res.Faults) != len(FaultKinds) {
		t.Fatalf("%d faults applied, want %d", len(res.Faults), len(FaultKinds))
	}
	for _, f := range res.Faults {
		if !f.OK() {
			t.Errorf("checkpoint fault %s not handled as DESIGN says (moved aside with a loud log, or a torn write dropped quietly; service starts), or not applied: %+v", f.Kind, f)
		}
	}
	if !res.OK() {
		t.Error("the run is not OK (see above)")
	}
}
