package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// TestChaosJournal is the journal phase alone, over the real processes: a
// sector zeroed inside the second of ten records (every record outside it
// recovered, the damage named to the byte), and a Release whose save fails
// because the journal was made immutable (taken back in memory, the same
// after a kill -9, saved by its retry once the disk works). It asserts no
// timing.
func TestChaosJournal(t *testing.T) {
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := stack.Build(ctx, dir, "nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager", "nodeplug-apiserver"); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Bin: dir, Plugins: 4, Devices: 4, Clients: 1, Interval: 300 * time.Millisecond,
		CompactBytes: 16 << 10, Journal: true, Converge: 2 * time.Minute, Progress: logWriter{t}}
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
	j := res.Journal
	if !j.Gap.Ran || !j.Gap.OK() || len(j.Gap.Lost) == 0 {
		t.Errorf("gap scenario: %+v; want it run, the damage named and every other record recovered", j.Gap)
	}
	if !j.Unsaved.OK() {
		t.Errorf("unsaved release: %+v", j.Unsaved)
	}
}
