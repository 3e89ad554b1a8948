package bench

import (
	"bytes"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestCompare(t *testing.T) {
	baseline := map[string]float64{
		"floor/dra/n=1000/total":         1.31, // regressed
		"floor/dra/n=1000/p99":           2,    // 25% worse exactly: not a regression
		"floor/device-plugin/n=10/total": 1.2,  // about the same
		"cpu/dra/n=1000/over_contract":   2,    // improved
		"floor/dra/n=10/total":           4,    // 25% better exactly: not listed
		"rss/devicemanager_start_anon":   0.4,  // not measured now
	}
	now := map[string]float64{
		"floor/dra/n=1000/total":         1.8,
		"floor/dra/n=1000/p99":           2.5,
		"floor/device-plugin/n=10/total": 1.3,
		"cpu/dra/n=1000/over_contract":   1.2,
		"floor/dra/n=10/total":           3,
		"floor/dra/n=100/total":          1.5, // not in the baseline
	}
	c := Compare(&Baseline{Ratios: baseline}, now)
	if c.Compared != 5 {
		t.Errorf("compared %d, want 5", c.Compared)
	}
	if want := []RatioChange{{"floor/dra/n=1000/total", 1.31, 1.8, [2]float64{1.31, 1.31}}}; !slices.Equal(c.Regressed, want) {
		t.Errorf("regressed %v, want %v", c.Regressed, want)
	}
	if want := []RatioChange{{"cpu/dra/n=1000/over_contract", 2, 1.2, [2]float64{2, 2}}}; !slices.Equal(c.Improved, want) {
		t.Errorf("improved %v, want %v", c.Improved, want)
	}
	if want := []string{"floor/dra/n=100/total"}; !slices.Equal(c.NotInBaseline, want) {
		t.Errorf("not in the baseline %v, want %v", c.NotInBaseline, want)
	}
	if want := []string{"rss/devicemanager_start_anon"}; !slices.Equal(c.NotMeasured, want) {
		t.Errorf("not measured %v, want %v", c.NotMeasured, want)
	}
	if !c.HasRegression() {
		t.Error("HasRegression false with a regression")
	}
}

func TestCompareNoRegression(t *testing.T) {
	ratios := map[string]float64{"floor/dra/n=1/total": 1.1, "floor/dra/n=1/p99": 1.4}
	c := Compare(&Baseline{Ratios: ratios}, ratios)
	if c.Compared != 2 || c.HasRegression() || len(c.Improved) > 0 || len(c.NotInBaseline) > 0 || len(c.NotMeasured) > 0 {
		t.Errorf("a run compared with itself: %+v", c)
	}
	if c := Compare(&Baseline{}, ratios); c.Compared != 0 || len(c.NotInBaseline) != 2 {
		t.Errorf("a run compared with an empty baseline: %+v", c)
	}
}

func TestPrintComparison(t *testing.T) {
	b := &Baseline{Date: "2026-12-03"}
	c := Compare(
		&Baseline{Ratios: map[string]float64{"floor/dra/n=1000/total": 1.31, "floor/dra/n=1000/p99": 1.2, "cpu/dra/n=1000/over_contract": 2, "rss/devicemanager_start_anon": 0.4}},
		map[string]float64{"floor/dra/n=1000/total": 1.8, "floor/dra/n=1000/p99": 1.6, "cpu/dra/n=1000/over_contract": 1.2, "floor/dra/n=1/total": 1},
	)
	var out, loud bytes.Buffer
	PrintComparison(&out, &loud, "bench/baseline.json", b, Machine{}, c)
	block := "!!! REGRESSION: 2 ratios are more than 25% worse than bench/baseline.json (2026-12-03):\n" +
		"!!!   floor/dra/n=1000/p99    baseline 1.20×  now 1.60×  (+33%)\n" +
		"!!!   floor/dra/n=1000/total  baseline 1.31×  now 1.80×  (+37%)\n"
	if !strings.Contains(out.String(), block) || !strings.Contains(loud.String(), block) {
		t.Errorf("the regression block is not on both writers; want\n%s\nstdout:\n%s\nstderr:\n%s", block, out.String(), loud.String())
	}
	for _, want := range []string{
		"1 ratio is more than 25% better than the baseline; consider -write-baseline:\n      cpu/dra/n=1000/over_contract  baseline 2.00×  now 1.20×  (-40%)\n",
		"Not in the baseline, not compared: floor/dra/n=1/total\n",
		"In the baseline, not measured by this run: rss/devicemanager_start_anon\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("stdout lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(loud.String(), "better") {
		t.Errorf("improvements on stderr:\n%s", loud.String())
	}

	out.Reset()
	loud.Reset()
	PrintComparison(&out, &loud, "bench/baseline.json", b, Machine{}, Compare(&Baseline{Ratios: map[string]float64{"a": 1, "b": 2}}, map[string]float64{"a": 1.1, "b": 2}))
	if want := "No regression: 2 ratios compared with bench/baseline.json (2026-12-03), none more than 25% worse.\n"; !strings.Contains(out.String(), want) || loud.Len() > 0 {
		t.Errorf("without a regression: stdout %q (want %q), stderr %q", out.String(), want, loud.String())
	}
}

// A run on another processor than the baseline's, or against a baseline
// that does not record its processor, says so; on stderr too when it
// reports a regression, since the machine may be the cause.
func TestPrintComparisonMachine(t *testing.T) {
	epyc25 := Machine{CPUs: 2, CPUModel: "AMD EPYC", CPUID: "AuthenticAMD family 25 model 17 stepping 1"}
	epyc26 := Machine{CPUs: 2, CPUModel: "AMD EPYC", CPUID: "AuthenticAMD family 26 model 2 stepping 1"}
	ratios := map[string]float64{"a": 1}
	b := &Baseline{Date: "2026-12-07", Machine: MachineDescription(epyc25), Processor: epyc25.Processor(), Ratios: ratios}
	old := &Baseline{Date: "2026-11-02", Machine: "AMD EPYC, 2 CPUs, go1.26.8, Linux", Ratios: ratios}
	for _, tc := range []struct {
		name     string
		b        *Baseline
		run      Machine
		now      float64 // the ratio a now; 2 regresses
		want     string  // the note, "" for none
		wantLoud bool
	}{
		{"same processor", b, epyc25, 2, "", false},
		{"another generation", b, epyc26, 1, "Note: bench/baseline.json was taken on another processor (2 CPUs, AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)) than this run's (2 CPUs, AMD EPYC (AuthenticAMD family 26 model 2 stepping 1))", false},
		{"another generation, regressed", b, epyc26, 2, "was taken on another processor", true},
		{"unrecorded", old, epyc25, 1, "Note: bench/baseline.json does not record the processor it was taken on (its machine: AMD EPYC, 2 CPUs, go1.26.8, Linux); this run's is 2 CPUs, AMD EPYC (AuthenticAMD family 25 model 17 stepping 1).", false},
	} {
		var out, loud bytes.Buffer
		PrintComparison(&out, &loud, "bench/baseline.json", tc.b, tc.run, Compare(tc.b, map[string]float64{"a": tc.now}))
		if tc.want == "" && strings.Contains(out.String()+loud.String(), "Note:") {
			t.Errorf("%s: a note on the machine:\nstdout:\n%s\nstderr:\n%s", tc.name, out.String(), loud.String())
		}
		if tc.want != "" && !strings.Contains(out.String(), tc.want) {
			t.Errorf("%s: stdout lacks %q:\n%s", tc.name, tc.want, out.String())
		}
		if gotLoud := strings.Contains(loud.String(), "Note:"); tc.want != "" && gotLoud != tc.wantLoud {
			t.Errorf("%s: the note on stderr %v, want %v:\n%s", tc.name, gotLoud, tc.wantLoud, loud.String())
		}
	}
}

// A baseline of several runs reports a ratio only beyond both the margin
// and the range its runs spanned: a ratio that swings by half from run to
// run is not a regression within that swing, and one that does not swing
// is still reported at 25%.
func TestCompareWithTheRunsRange(t *testing.T) {
	b := &Baseline{
		Runs: 3,
		Ratios: map[string]float64{
			"floor/dra/n=1/total":         2,   // runs 1.6–3.2: noisy
			"floor/dra/n=1000/total":      1.3, // runs 1.25–1.4: steady
			"cpu/dra/n=100/over_contract": 1.6, // runs 1.5–1.7
		},
		Range: map[string][2]float64{
			"floor/dra/n=1/total":         {1.6, 3.2},
			"floor/dra/n=1000/total":      {1.25, 1.4},
			"cpu/dra/n=100/over_contract": {1.5, 1.7},
		},
	}
	c := Compare(b, map[string]float64{
		"floor/dra/n=1/total":         3.0,  // +50%, within the runs: not reported
		"floor/dra/n=1000/total":      1.7,  // +31%, above every run: reported
		"cpu/dra/n=100/over_contract": 1.15, // -28%, below every run: improved
	})
	if want := []RatioChange{{"floor/dra/n=1000/total", 1.3, 1.7, [2]float64{1.25, 1.4}}}; !slices.Equal(c.Regressed, want) {
		t.Errorf("regressed %v, want %v", c.Regressed, want)
	}
	if want := []RatioChange{{"cpu/dra/n=100/over_contract", 1.6, 1.15, [2]float64{1.5, 1.7}}}; !slices.Equal(c.Improved, want) {
		t.Errorf("improved %v, want %v", c.Improved, want)
	}
	if c := Compare(b, map[string]float64{"floor/dra/n=1/total": 3.3}); len(c.Regressed) != 1 {
		t.Errorf("a ratio above every run and 65%% above the median: %+v", c)
	}

	var out, loud bytes.Buffer
	PrintComparison(&out, &loud, "bench/baseline.json", &Baseline{Date: "2026-12-07", Runs: 3, Ratios: b.Ratios, Range: b.Range}, Machine{}, c)
	block := "!!! REGRESSION: 1 ratio is more than 25% worse than bench/baseline.json (2026-12-07, median of 3 runs) and than any of its runs:\n" +
		"!!!   floor/dra/n=1000/total  baseline 1.30× (runs 1.25–1.40×)  now 1.70×  (+31%)\n"
	if !strings.Contains(out.String(), block) || !strings.Contains(loud.String(), block) {
		t.Errorf("want on both writers\n%s\nstdout:\n%s\nstderr:\n%s", block, out.String(), loud.String())
	}
}

// MergeBaseline takes each ratio's median over the runs (the mean of the
// middle two for an even count) and its range; a ratio some runs lack is
// the median of those that have it.
func TestMergeBaseline(t *testing.T) {
	run := func(command string, ratios map[string]float64) *Results {
		return &Results{Machine: Machine{CPUs: 2, CPUModel: "AMD EPYC", CPUID: "AuthenticAMD family 25 model 17 stepping 1", GoVersion: "go1.99"}, Command: command, Ratios: ratios}
	}
	full, floor := "nodeplug-bench -floor-rounds 5", "nodeplug-bench -floor-rounds 5 -phases floor,footprint"
	b, err := MergeBaseline([]*Results{
		run(full, map[string]float64{"a": 1.4, "b": 2, "c": 5}),
		run(floor, map[string]float64{"a": 1.1, "b": 4}),
		run(floor, map[string]float64{"a": 1.2, "b": 3, "c": 7}),
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]float64{"a": 1.2, "b": 3, "c": 6}; !maps.Equal(b.Ratios, want) {
		t.Errorf("ratios %v, want %v", b.Ratios, want)
	}
	if want := map[string][2]float64{"a": {1.1, 1.4}, "b": {2, 4}, "c": {5, 7}}; !maps.Equal(b.Range, want) {
		t.Errorf("range %v, want %v", b.Range, want)
	}
	if b.Runs != 3 || !strings.HasPrefix(b.Machine, "AMD EPYC (AuthenticAMD family 25 model 17 stepping 1), 2 CPUs, go1.99, ") ||
		b.Processor != "2 CPUs, AMD EPYC (AuthenticAMD family 25 model 17 stepping 1)" {
		t.Errorf("baseline %+v", b)
	}
	for _, want := range []string{"the median of 3 runs", "`" + full + "` (1), `" + floor + "` (2)"} {
		if !strings.Contains(b.Note, want) {
			t.Errorf("note %q lacks %q", b.Note, want)
		}
	}
	// Written and read back whole.
	path := filepath.Join(t.TempDir(), "baseline.json")
	if err := WriteBaseline(path, b); err != nil {
		t.Fatal(err)
	}
	got, err := ReadBaseline(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Runs != 3 || got.Processor != b.Processor || !maps.Equal(got.Range, b.Range) || !maps.Equal(got.Ratios, b.Ratios) {
		t.Errorf("read back %+v, wrote %+v", got, b)
	}

	if _, err := MergeBaseline([]*Results{run(full, map[string]float64{"a": 1})}); err == nil {
		t.Error("a baseline of one run merged")
	}
	if _, err := MergeBaseline([]*Results{run(full, map[string]float64{"a": 1}), run(full, nil)}); err == nil || !strings.Contains(err.Error(), "run 2 of 2") {
		t.Errorf("a run without ratios: %v", err)
	}
	// Runs of two machines are refused, and so are runs of two processor
	// generations that share a name.
	for _, other := range []func(*Machine){
		func(m *Machine) { m.CPUModel = "Intel Xeon" },
		func(m *Machine) { m.CPUID = "AuthenticAMD family 26 model 2 stepping 1" },
		func(m *Machine) { m.CPUs = 4 },
	} {
		r := run(full, map[string]float64{"a": 1})
		other(&r.Machine)
		if _, err := MergeBaseline([]*Results{run(full, map[string]float64{"a": 1}), r}); err == nil || !strings.Contains(err.Error(), "another machine") {
			t.Errorf("runs of two machines (%s): %v", r.Machine.Processor(), err)
		}
	}
}

func TestReadResults(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	if err := os.WriteFile(good, []byte(`{"machine": {"cpus": 2}, "ratios": {"a": 1.5}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := ReadResults(good)
	if err != nil || r.Machine.CPUs != 2 || r.Ratios["a"] != 1.5 {
		t.Errorf("ReadResults = %+v, %v", r, err)
	}
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte(`{"ratios": `), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadResults(bad); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("a truncated file: %v", err)
	}
}

func TestBaselineRoundTrip(t *testing.T) {
	r := &Results{Machine: Machine{CPUs: 2, GoVersion: "go1.99"}, Ratios: map[string]float64{"floor/dra/n=1000/total": 1.31, RatioRSSStartAnon: 0.35}}
	b := NewBaseline(r, "a note")
	if !strings.HasPrefix(b.Machine, "2 CPUs, go1.99, ") || len(b.Date) != len("2026-12-03") {
		t.Errorf("baseline machine %q, date %q", b.Machine, b.Date)
	}
	path := filepath.Join(t.TempDir(), "sub", "baseline.json")
	if err := WriteBaseline(path, b); err != nil {
		t.Fatal(err)
	}
	got, err := ReadBaseline(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Date != b.Date || got.Machine != b.Machine || got.Note != b.Note || !maps.Equal(got.Ratios, r.Ratios) {
		t.Errorf("read back %+v, wrote %+v", got, b)
	}
	r.Ratios["floor/dra/n=1000/total"] = 9 // the baseline holds a copy
	if got.Ratios["floor/dra/n=1000/total"] != 1.31 {
		t.Error("the baseline shares its ratios with the results")
	}
	if err := WriteBaseline(filepath.Join(t.TempDir(), "empty.json"), &Baseline{}); err == nil {
		t.Error("a baseline without ratios was written")
	}
}

// TestReadBaselineErrors: a bad baseline file gives an error that names it.
func TestReadBaselineErrors(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"not-json.json":       "ratios: 1",
		"truncated.json":      `{"date": "2026-12-03", "ratios": {"a": 1`,
		"no-ratios.json":      `{"date": "2026-12-03", "machine": "m", "note": "n"}`,
		"zero-ratio.json":     `{"ratios": {"floor/dra/n=1/total": 0}}`,
		"string.json":         `{"ratios": {"floor/dra/n=1/total": "1.2"}}`,
		"unknown-key.json":    `{"ratio": {"floor/dra/n=1/total": 1.2}}`,
		"two-values.json":     `{"ratios": {"a": 1}} {"ratios": {"a": 2}}`,
		"outside-range.json":  `{"ratios": {"a": 1}, "runs": 2, "range": {"a": [1.1, 1.3]}}`,
		"range-no-ratio.json": `{"ratios": {"a": 1}, "runs": 2, "range": {"a": [0.9, 1.3], "b": [1, 2]}}`,
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := ReadBaseline(path)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %v, want one naming the file", name, err)
		}
	}
	missing := filepath.Join(dir, "missing.json")
	if _, err := ReadBaseline(missing); !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
}

// TestLoadBaseline: the default file may be absent, a named one may not;
// an empty path compares with nothing.
func TestLoadBaseline(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "baseline.json")
	if b, err := LoadBaseline(missing, false); b != nil || err != nil {
		t.Errorf("absent default: %v, %v; want no baseline and no error", b, err)
	}
	if _, err := LoadBaseline(missing, true); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("absent named file: %v, want an error naming it", err)
	}
	if b, err := LoadBaseline("", true); b != nil || err != nil {
		t.Errorf("empty path: %v, %v", b, err)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadBaseline(bad, false); err == nil {
		t.Error("a bad default file gave no error")
	}
}
