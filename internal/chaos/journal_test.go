package chaos

import (
	"testing"
	"time"
)

// TestChaosJournal is the journal phase alone, over the real processes: a
// sector zeroed inside the second of ten records (every record outside it
// recovered, the damage named to the byte), and a Release whose save fails
// because the journal was made immutable (taken back in memory, the same
// after a kill -9, saved by its retry once the disk works). It asserts no
// timing.
func TestChaosJournal(t *testing.T) {
	cfg := Config{Plugins: 4, Devices: 4, Clients: 1, Interval: 300 * time.Millisecond,
		CompactBytes: 16 << 10, Journal: true, Converge: 2 * time.Minute}
	res := runChaos(t, cfg)
	j := res.Journal
	if !j.Gap.Ran || !j.Gap.OK() || len(j.Gap.Lost) == 0 {
		t.Errorf("gap scenario: %+v; want it run, the damage named and every other record recovered", j.Gap)
	}
	if !j.Unsaved.OK() {
		t.Errorf("unsaved release: %+v", j.Unsaved)
	}
}
