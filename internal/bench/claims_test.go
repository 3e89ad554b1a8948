package bench

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// TestClaimsPhase runs `nodeplug-bench -short -phases claims`: every caller
// count gets its pairs, the driver's NodePrepareResources times and the
// ratio. It checks the bench, not the speed.
func TestClaimsPhase(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the services")
	}
	bin := binaries(t)
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	out := filepath.Join(dir, "results.json")
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "nodeplug-bench"), "-short", "-phases", "claims", "-json", out)
	output, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("nodeplug-bench -short -phases claims: %v\n%s", err, output)
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
	if len(r.Claims) != len(cfg.ClaimCallers) {
		t.Fatalf("%d claims results, want one per caller count %v", len(r.Claims), cfg.ClaimCallers)
	}
	for i, c := range r.Claims {
		want := cfg.ClaimCallers[i] * cfg.ClaimPairs
		if c.Callers != cfg.ClaimCallers[i] || c.Pairs != want || c.Prepare.Count != want || c.Release.Count != want ||
			c.DriverPrepare.Count != want || c.PairsPerSec <= 0 || c.PrepareP99OverDriver <= 0 {
			t.Errorf("claims result %+v: want %d callers, %d pairs each timed, %d driver prepares, a rate and a ratio", c, cfg.ClaimCallers[i], want, want)
		}
	}
}
