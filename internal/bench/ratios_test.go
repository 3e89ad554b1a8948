package bench

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"
)

// floorResult is a FloorResult with the given ratios and one round per pair
// of CPU figures (nodeplug's, the contract floor's).
func floorResult(kind string, n int, total, p99 float64, cpu ...[2]float64) FloorResult {
	f := FloorResult{Kind: kind, N: n, RatioTotal: total, RatioP99: p99}
	for _, c := range cpu {
		f.Rounds = append(f.Rounds, FloorRound{
			Nodeplug: RoundFigures{CPUmsPerPlugin: c[0]},
			Contract: RoundFigures{CPUmsPerPlugin: c[1]},
		})
	}
	return f
}

func TestComputeRatios(t *testing.T) {
	r := &Results{
		Floor: []FloorResult{
			floorResult(KindDevicePlugin, 10, 1.4, 2.1, [2]float64{5, 1}), // N < 100: no CPU ratio
			floorResult(KindDevicePlugin, 100, 1.3, 1.9, [2]float64{2, 1}, [2]float64{3, 1}, [2]float64{9, 1}),
			floorResult(KindDRA, 1000, 1.1, 1.2, [2]float64{4, 2}, [2]float64{0, 2}, [2]float64{6, 2}), // a round under a tick is left out
			floorResult(KindDRA, 100, 0, 1.5, [2]float64{1, 0}),                                        // no total, no CPU of the contract floor
		},
		Footprint: FootprintResult{RSSMiB: map[string]float64{"devicemanager": 51}, DeviceManagerStartMiB: 51, DeviceManagerStartAnonMiB: 7, DeviceManagerStartFileMiB: 44},
	}
	want := map[string]float64{
		"floor/device-plugin/n=10/total":        1.4,
		"floor/device-plugin/n=10/p99":          2.1,
		"floor/device-plugin/n=100/total":       1.3,
		"floor/device-plugin/n=100/p99":         1.9,
		"cpu/device-plugin/n=100/over_contract": 3, // median of 2, 3, 9
		"floor/dra/n=1000/total":                1.1,
		"floor/dra/n=1000/p99":                  1.2,
		"cpu/dra/n=1000/over_contract":          2.5, // median of 2 and 3
		"floor/dra/n=100/p99":                   1.5,
		"rss/devicemanager_start":               2.55, // 51 MiB over 20
		"rss/devicemanager_start_anon":          0.35, // 7 MiB over 20
	}
	got := ComputeRatios(r)
	if !maps.Equal(got, want) {
		t.Errorf("ComputeRatios:\n got %v\nwant %v", got, want)
	}
}

func TestComputeRatiosPhasesNotRun(t *testing.T) {
	if got := ComputeRatios(&Results{}); len(got) != 0 {
		t.Errorf("ratios of a run with no floor or footprint phase: %v", got)
	}
	onlyFootprint := &Results{Footprint: FootprintResult{DeviceManagerStartMiB: 40, DeviceManagerStartAnonMiB: 10}}
	if got := slices.Sorted(maps.Keys(ComputeRatios(onlyFootprint))); !slices.Equal(got, []string{RatioRSSStart, RatioRSSStartAnon}) {
		t.Errorf("ratios of a footprint-only run: %v", got)
	}
}

func TestKindSlug(t *testing.T) {
	for kind, want := range map[string]string{KindDevicePlugin: "device-plugin", KindDRA: "dra"} {
		if got := kindSlug(kind); got != want {
			t.Errorf("kindSlug(%q) = %q, want %q", kind, got, want)
		}
	}
}

// TestPrintRatios: Print ends with the ratios, by name, the RSS ratio with
// its memory figures beside it.
func TestPrintRatios(t *testing.T) {
	r := &Results{
		Floor:     []FloorResult{floorResult(KindDRA, 1000, 1.31, 1.5, [2]float64{4, 2})},
		Footprint: FootprintResult{DeviceManagerStartMiB: 51, DeviceManagerStartAnonMiB: 7, DeviceManagerStartFileMiB: 44},
	}
	r.Ratios = ComputeRatios(r)
	var buf bytes.Buffer
	Print(&buf, r)
	out := buf.String()
	i := strings.Index(out, "Ratios (lower is better)")
	if i < 0 {
		t.Fatalf("no ratios section:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out[i:]), "\n")[1:]
	summary := lines[len(lines)-1]
	lines = lines[:len(lines)-1]
	// floor/dra 1.31 and 1.5 miss 1.2; the CPU ratio 2 misses 1.5; the
	// RSS ratio 2.55 misses 1.2; the RssAnon ratio has no target.
	if want := "targets met: 0 of 4; missed: cpu/dra/n=1000/over_contract, floor/dra/n=1000/p99, floor/dra/n=1000/total, " + RatioRSSStart; strings.TrimSpace(summary) != want {
		t.Errorf("summary %q, want %q", summary, want)
	}
	if l := lines[0]; !strings.Contains(l, "target ≤ 1.5×") || !strings.Contains(l, "MISSED") {
		t.Errorf("CPU ratio line lacks its target: %q", l)
	}
	var names []string
	for _, l := range lines {
		names = append(names, strings.Fields(l)[0])
	}
	if want := []string{"cpu/dra/n=1000/over_contract", "floor/dra/n=1000/p99", "floor/dra/n=1000/total", RatioRSSStart, RatioRSSStartAnon}; !slices.Equal(names, want) {
		t.Errorf("ratio lines %q, want names %v", lines, want)
	}
	if l := lines[len(lines)-2]; !strings.Contains(l, "2.55×") || !strings.Contains(l, "VmRSS 51.0 MiB") || !strings.Contains(l, "RssFile 44.0 MiB") || !strings.Contains(l, "target ≤ 1.2×") {
		t.Errorf("RSS ratio line lacks its figures: %q", l)
	}
	if l := lines[len(lines)-1]; !strings.Contains(l, "0.35×") || !strings.Contains(l, "RssAnon 7.0 MiB") || strings.Contains(l, "target") {
		t.Errorf("RssAnon ratio line lacks its figures: %q", l)
	}
	if strings.Contains(out, "Footprint") {
		t.Errorf("a footprint section without the footprint phase:\n%s", out)
	}
}

func TestParseRSS(t *testing.T) {
	status := "Name:\tnodeplug-devicemanager\nVmPeak:\t 1300000 kB\nVmHWM:\t   61440 kB\nVmRSS:\t   52224 kB\nRssAnon:\t    7168 kB\nRssFile:\t   45056 kB\nRssShmem:\t       0 kB\nThreads:\t8\n"
	got, err := parseRSS(status)
	if err != nil {
		t.Fatal(err)
	}
	if want := (rssSample{VmRSS: 51, Anon: 7, File: 44, Peak: 60}); got != want {
		t.Errorf("parseRSS = %+v, want %+v", got, want)
	}
	// A kernel before 4.5 has no RssAnon or RssFile: VmRSS alone.
	if got, err := parseRSS("VmRSS:\t 2048 kB\n"); err != nil || got != (rssSample{VmRSS: 2}) {
		t.Errorf("parseRSS of VmRSS alone = %+v, %v", got, err)
	}
	if _, err := parseRSS("Name:\tx\n"); err == nil {
		t.Error("parseRSS without VmRSS: no error")
	}
	if _, err := parseRSS("VmRSS:\t lots kB\n"); err == nil || !strings.Contains(err.Error(), "VmRSS") {
		t.Errorf("parseRSS of a bad VmRSS: %v", err)
	}
}

func TestRatioTarget(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    float64
		want string // the target, "" for none
		met  bool
	}{
		{"floor/dra/n=1000/total", 1.2, "≤ 1.2×", true},
		{"floor/dra/n=1000/p99", 1.21, "≤ 1.2×", false},
		{"floor/device-plugin/n=10/total", 1.5, "≤ 1.5×", true},
		{"cpu/dra/n=100/over_contract", 1.51, "≤ 1.5×", false},
		{"kubelet/device-plugin/n=1000/p99", 0.99, "< 1.0×", true},
		{"kubelet/dra/n=1000/total", 1, "< 1.0×", false},
		{RatioRSSStart, 1.19, "≤ 1.2×", true},
		{RatioRSSStartAnon, 9, "", false},
		{"floor/unknown-kind/n=1/total", 1, "", false},
	} {
		tg, ok := ratioTarget(tc.name)
		if got := map[bool]string{true: tg.String()}[ok]; got != tc.want {
			t.Errorf("ratioTarget(%q) = %q, want %q", tc.name, got, tc.want)
			continue
		}
		if ok && tg.Met(tc.v) != tc.met {
			t.Errorf("%s: Met(%v) = %v, want %v", tc.name, tc.v, !tc.met, tc.met)
		}
	}
}
