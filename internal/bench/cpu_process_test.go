package bench

import (
	"strings"
	"testing"
)

// TestCPUByProcess: a round's CPU per plugin is kept process by process,
// the rounds' median of each is taken with a round that left a process out
// counted as zero, and the floor section prints them in registration's
// order beside the contract floor's.
func TestCPUByProcess(t *testing.T) {
	before := map[string]float64{"watcher": 1.0, "reconciler": 2.0, "devicemanager": 3.0, "apiserver": 4.0}
	after := map[string]float64{"watcher": 1.004, "reconciler": 2.061, "devicemanager": 3.0561, "apiserver": 4.0, "dramanager": 9}
	var f RoundFigures
	f.setCPU(before, after, 100)
	got := f.CPUmsPerPluginByProcess
	want := map[string]float64{"watcher": 0.04, "reconciler": 0.61, "devicemanager": 0.56}
	if len(got) != len(want) {
		t.Fatalf("CPU by process = %v; want %v (an idle process and one read once left out)", got, want)
	}
	for p, v := range want {
		if got[p] != v {
			t.Errorf("CPU of %s = %v; want %v", p, got[p], v)
		}
	}
	// The total is of the same processes: the dramanager, read once, is
	// not counted whole (9 s) in it.
	if f.CPUmsPerPlugin != 1.21 {
		t.Errorf("CPU per plugin in all = %v; want 1.21 (the processes read twice)", f.CPUmsPerPlugin)
	}
	for _, tc := range []struct {
		name  string
		after map[string]float64
		n     int
	}{{"no plugin", after, 0}, {"no second reading", nil, 100}} {
		var f RoundFigures
		f.setCPU(before, tc.after, tc.n)
		if f.CPUmsPerPlugin != 0 || len(f.CPUmsPerPluginByProcess) != 0 {
			t.Errorf("%s: CPU %v, by process %v; want none", tc.name, f.CPUmsPerPlugin, f.CPUmsPerPluginByProcess)
		}
	}

	round := func(total float64, by map[string]float64) RoundFigures {
		return RoundFigures{CPUmsPerPlugin: total, CPUmsPerPluginByProcess: by}
	}
	m := medianFigures([]RoundFigures{
		round(1.2, map[string]float64{"reconciler": 0.6, "devicemanager": 0.5, "dramanager": 0.1}),
		round(1.0, map[string]float64{"reconciler": 0.5, "devicemanager": 0.5}),
		round(1.4, map[string]float64{"reconciler": 0.7, "devicemanager": 0.7}),
	})
	if m.CPUmsPerPlugin != 1.2 || m.CPUmsPerPluginByProcess["reconciler"] != 0.6 || m.CPUmsPerPluginByProcess["devicemanager"] != 0.5 {
		t.Errorf("median = %+v; want 1.2 in all, reconciler 0.6, devicemanager 0.5", m)
	}
	if v, ok := m.CPUmsPerPluginByProcess["dramanager"]; ok {
		t.Errorf("dramanager, in one round of three, has a median of %v; want it left out (0.1, 0, 0)", v)
	}

	np := map[string]float64{"apiserver": 0.01, "devicemanager": 0.5, "reconciler": 0.6, "watcher": 0.05}
	cf := map[string]float64{"reconciler": 0.4, "devicemanager": 0.3, "watcher": 0.02}
	res := FloorResult{Kind: KindDevicePlugin, N: 100, Rounds: []FloorRound{{Nodeplug: round(1.16, np), Contract: round(0.72, cf)}}}
	small := FloorResult{Kind: KindDevicePlugin, N: 10, Rounds: []FloorRound{{Nodeplug: round(2, np), Contract: round(1, cf)}}}
	var b strings.Builder
	Print(&b, &Results{Floor: []FloorResult{small, res}})
	out := b.String()
	line := "N=100   CPU per plugin by process, ms: nodeplug watcher 0.05, reconciler 0.60, devicemanager 0.50, apiserver 0.01 | contract floor watcher 0.02, reconciler 0.40, devicemanager 0.30"
	if !strings.Contains(out, line) {
		t.Errorf("the floor section lacks %q:\n%s", line, out)
	}
	if strings.Count(out, "by process") != 1 {
		t.Errorf("CPU by process shown below 100 plugins:\n%s", out)
	}
	if got := byProcess(nil); got != "-" {
		t.Errorf("byProcess(nil) = %q; want -", got)
	}
	if got := byProcess(map[string]float64{"zeta": 1, "alpha": 2, "reconciler": 3}); got != "reconciler 3.00, alpha 2.00, zeta 1.00" {
		t.Errorf("byProcess puts another process out of order: %q", got)
	}
}
