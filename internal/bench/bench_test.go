package bench

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// TestShortRun runs `nodeplug-bench -short` against freshly built binaries:
// it must complete, write JSON holding every figure, and end its churn run in
// exactly the expected state. It checks the bench, not the speed.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the services")
	}
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := stack.Build(ctx, dir, "nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager", "nodeplug-bench"); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "results.json")
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "nodeplug-bench"), "-short", "-json", out)
	output, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nodeplug-bench -short: %v\n%s", err, output)
	}
	t.Logf("%s", output)
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		t.Fatal(err)
	}
	cfg := Short()
	if len(r.Registration) != len(cfg.RegistrationNs) {
		t.Errorf("registration rounds %d, want %d", len(r.Registration), len(cfg.RegistrationNs))
	}
	for _, rr := range r.Registration {
		if rr.Notify.Count != rr.N || rr.Allocatable.Count != rr.N || rr.Deregistration.Count != rr.N || rr.AllRegisteredMs <= 0 {
			t.Errorf("registration N=%d incomplete: %+v", rr.N, rr)
		}
	}
	if want := 2 * len(cfg.RegistrationNs); len(r.Floor) != want {
		t.Errorf("floor comparisons %d, want %d", len(r.Floor), want)
	}
	for _, f := range r.Floor {
		if len(f.Rounds) != cfg.FloorRounds || f.RatioTotal <= 0 || f.ContractRatioTotal <= 0 || f.OverheadRatioTotal <= 0 {
			t.Errorf("floor %s N=%d incomplete: %+v", f.Kind, f.N, f)
			continue
		}
		for _, rd := range f.Rounds {
			if rd.Nodeplug.Notify.Count != f.N || rd.Floor.Notify.Count != f.N || rd.Contract.Notify.Count != f.N {
				t.Errorf("floor %s N=%d round incomplete: %+v", f.Kind, f.N, rd)
			}
		}
	}
	if r.Footprint.DeviceManagerAfterMiB <= 0 {
		t.Errorf("no devicemanager RSS after the plugins left: %+v", r.Footprint)
	}
	if b := r.Footprint.Bare; b.Conns != cfg.RSSPlugins || b.RSSKiBAfter <= 0 || b.GoroutinesAfter <= b.GoroutinesBefore {
		t.Errorf("bare client figure incomplete: %+v", b)
	}
	if st := r.Stale; st.Stale != cfg.StaleSockets || st.Quiet.Count != cfg.StaleSamples || st.BesideStale.Count != cfg.StaleSamples {
		t.Errorf("registration beside stale sockets incomplete: %+v", st)
	}
	if r.Churn.Cycles == 0 || r.Churn.Register.Count != r.Churn.Cycles || r.Churn.Deregister.Count != r.Churn.Cycles {
		t.Errorf("churn incomplete: %+v", r.Churn)
	}
	if !r.Churn.FinalExact {
		t.Errorf("churn did not end in the expected state: %s (leftover %v)", r.Churn.FinalProblem, r.Churn.Leftover)
	}
	if want := len(cfg.AllocDevices) * len(cfg.AllocCallers); len(r.Allocation) != want {
		t.Errorf("allocation runs %d, want %d", len(r.Allocation), want)
	}
	for _, a := range r.Allocation {
		if a.Pairs == 0 || a.Allocate.Count != a.Pairs {
			t.Errorf("allocation run incomplete: %+v", a)
		}
	}
	if d := r.Durability; d.FsyncFloor.Count == 0 || d.Allocate8.Pairs == 0 || d.Plugins != cfg.AllocPlugins || d.Many.Pairs == 0 ||
		d.Loop.Pairs == 0 || d.Loop.Journals == 0 || d.Loop.SnapshotBytes == 0 || d.Loop.MaxJournalBytes == 0 {
		t.Errorf("durability incomplete: %+v", d)
	}
	if r.Propagation.Latency.Count != cfg.Flips || r.Propagation.Devices != cfg.FlipDevices {
		t.Errorf("propagation incomplete: %+v", r.Propagation)
	}
	for _, s := range stack.Services {
		if r.Footprint.RSSMiB[s] <= 0 {
			t.Errorf("no RSS for %s: %+v", s, r.Footprint)
		}
		if _, ok := r.Footprint.IdleCPUPercent[s]; !ok {
			t.Errorf("no idle CPU for %s", s)
		}
	}
	if r.Footprint.DeviceManagerLoadedMiB <= 0 || r.Footprint.DeviceManagerPlugins != cfg.RSSPlugins {
		t.Errorf("devicemanager footprint incomplete: %+v", r.Footprint)
	}
}
