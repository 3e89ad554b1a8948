package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeplug/nodeplug/internal/stack"
)

// DefaultBaselineFile is the committed baseline a run is compared with,
// relative to the repository's root (where make runs the bench).
const DefaultBaselineFile = "bench/baseline.json"

// regressionMargin is how far a ratio may move from its baseline before it
// is reported: more than 25% above is a regression, more than 25% below an
// improvement worth a new baseline. A baseline of several runs widens
// that to the range its runs spanned (see Compare).
const regressionMargin = 0.25

// Baseline is the ratios (Results.Ratios) of one run, or the median of
// several, kept in a file for later runs to be compared with.
type Baseline struct {
	Date    string `json:"date"`    // when the run was, YYYY-MM-DD (UTC)
	Machine string `json:"machine"` // what it ran on (MachineDescription)
	// Processor is the processor it ran on (Machine.Processor), which a
	// run's is compared with; "" in a baseline written before it was
	// recorded.
	Processor string             `json:"processor,omitempty"`
	Note      string             `json:"note"` // how it was made, for whoever reads the file
	Ratios    map[string]float64 `json:"ratios"`
	// Runs is how many runs Ratios is the median of (0 or 1: one), and
	// Range each ratio's lowest and highest value over them: how far the
	// same source moved from run to run on that machine.
	Runs  int                   `json:"runs,omitempty"`
	Range map[string][2]float64 `json:"range,omitempty"`
}

// NewBaseline is r's ratios as a baseline dated today, described by note.
func NewBaseline(r *Results, note string) *Baseline {
	return &Baseline{
		Date:      time.Now().UTC().Format(time.DateOnly),
		Machine:   MachineDescription(r.Machine),
		Processor: r.Machine.Processor(),
		Note:      note,
		Ratios:    maps.Clone(r.Ratios),
	}
}

// MergeBaseline is the baseline of several runs' results, dated today:
// each ratio the median of the runs that have it (the mean of the middle
// two for an even count), with its range, and a note that says what the
// runs were (their commands). The runs are to be of one machine: runs
// whose processor or CPU count differ, fewer than two runs, or runs
// without ratios are refused.
func MergeBaseline(runs []*Results) (*Baseline, error) {
	if len(runs) < 2 {
		return nil, fmt.Errorf("a baseline of several runs needs at least two, got %d", len(runs))
	}
	for i, r := range runs[1:] {
		if a, b := runs[0].Machine.Processor(), r.Machine.Processor(); a != b {
			return nil, fmt.Errorf("run %d of %d is of another machine (%s) than run 1 (%s): a baseline is one machine's", i+2, len(runs), b, a)
		}
	}
	values := map[string][]float64{}
	for i, r := range runs {
		if len(r.Ratios) == 0 {
			return nil, fmt.Errorf("run %d of %d has no ratios (they come from the floor and footprint phases)", i+1, len(runs))
		}
		for name, v := range r.Ratios {
			values[name] = append(values[name], v)
		}
	}
	b := &Baseline{
		Date:      time.Now().UTC().Format(time.DateOnly),
		Machine:   MachineDescription(runs[0].Machine),
		Processor: runs[0].Machine.Processor(),
		Note:      mergedNote(runs),
		Ratios:    make(map[string]float64, len(values)),
		Runs:      len(runs),
		Range:     make(map[string][2]float64, len(values)),
	}
	for name, vs := range values {
		slices.Sort(vs)
		m := vs[len(vs)/2]
		if len(vs)%2 == 0 {
			m = (vs[len(vs)/2-1] + m) / 2
		}
		b.Ratios[name] = m
		b.Range[name] = [2]float64{vs[0], vs[len(vs)-1]}
	}
	return b, nil
}

// mergedNote says what a baseline of runs is: the median of how many
// runs, each command with its count of runs, and how it is compared.
func mergedNote(runs []*Results) string {
	var order []string
	count := map[string]int{}
	for _, r := range runs {
		c := r.Command
		if c == "" {
			c = "a command not recorded"
		} else {
			c = "`" + c + "`"
		}
		if count[c] == 0 {
			order = append(order, c)
		}
		count[c]++
	}
	parts := make([]string, len(order))
	for i, c := range order {
		parts[i] = fmt.Sprintf("%s (%d)", c, count[c])
	}
	return fmt.Sprintf("ratios (lower is better), each the median of %d runs in one sitting, with its range over them: %s; merged with -baseline-from. "+
		"A run reports a ratio more than 25%% above its value here and above its range. Write it again on a quiet machine when the figures move for good.",
		len(runs), strings.Join(parts, ", "))
}

// ReadResults reads a run's figures, as -json wrote them. Every error
// names the file.
func ReadResults(path string) (*Results, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("results: %w", err)
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("results %s are not the bench's figures: %w", path, err)
	}
	return &r, nil
}

// MachineDescription describes the machine of m in one line: its
// processor when known, its CPUs, the Go version and the kernel as uname
// reports it.
func MachineDescription(m Machine) string {
	kernel := "unknown kernel"
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		kernel = fmt.Sprintf("%s %s %s", unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Machine[:]))
	}
	d := fmt.Sprintf("%d CPUs, %s, %s", m.CPUs, m.GoVersion, kernel)
	if p := m.cpu(); p != "" {
		d = p + ", " + d
	}
	return d
}

// Processor is what a run's and a baseline's machines are compared by:
// the CPU count and the processor's name and identity ("2 CPUs, AMD EPYC
// (AuthenticAMD family 25 model 17 stepping 1)"). It leaves out the Go
// version and the kernel, which a baseline may outlive.
func (m Machine) Processor() string {
	if p := m.cpu(); p != "" {
		return fmt.Sprintf("%d CPUs, %s", m.CPUs, p)
	}
	return fmt.Sprintf("%d CPUs", m.CPUs)
}

// cpu is the processor's name and identity, as far as they are known.
func (m Machine) cpu() string {
	switch {
	case m.CPUModel != "" && m.CPUID != "":
		return m.CPUModel + " (" + m.CPUID + ")"
	case m.CPUModel != "":
		return m.CPUModel
	default:
		return m.CPUID
	}
}

// ReadBaseline reads the baseline file at path. Every error names the
// file; a missing file's wraps fs.ErrNotExist.
func ReadBaseline(path string) (*Baseline, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("baseline: %w", err)
	}
	var b Baseline
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return nil, fmt.Errorf("baseline %s is not a baseline file: %w", path, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("baseline %s is not a baseline file: more than one JSON value", path)
	}
	if len(b.Ratios) == 0 {
		return nil, fmt.Errorf("baseline %s has no ratios", path)
	}
	for _, name := range slices.Sorted(maps.Keys(b.Ratios)) {
		if v := b.Ratios[name]; v <= 0 {
			return nil, fmt.Errorf("baseline %s: ratio %s is %v, not a positive number", path, name, v)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(b.Range)) {
		v, ok := b.Ratios[name]
		if r := b.Range[name]; !ok || r[0] > v || v > r[1] {
			return nil, fmt.Errorf("baseline %s: the range of ratio %s, %v, does not hold its value %v", path, name, r, v)
		}
	}
	return &b, nil
}

// LoadBaseline reads the baseline a run is compared with: the file at path,
// none when path is empty. A missing file is an error when it was named
// (explicit), and no baseline when it is the default: a checkout without
// one compares with nothing.
func LoadBaseline(path string, explicit bool) (*Baseline, error) {
	if path == "" {
		return nil, nil
	}
	b, err := ReadBaseline(path)
	if err != nil && !explicit && errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}

// WriteBaseline writes b to path as indented JSON, making its directory
// when needed. A baseline without ratios is refused: none would be
// compared.
func WriteBaseline(path string, b *Baseline) error {
	if len(b.Ratios) == 0 {
		return fmt.Errorf("baseline %s: this run has no ratios to record (they come from the floor and footprint phases)", path)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("baseline %s: %w", path, err)
	}
	if err := stack.WriteJSON(path, b); err != nil {
		return fmt.Errorf("baseline %s: %w", path, err)
	}
	return nil
}

// RatioChange is a ratio in the baseline and now.
type RatioChange struct {
	Name          string
	Baseline, Now float64
	// Range is the baseline runs' lowest and highest value of the ratio
	// (both Baseline for a baseline of one run).
	Range [2]float64
}

// percent is the change from the baseline, in percent of it.
func (c RatioChange) percent() float64 { return 100 * (c.Now/c.Baseline - 1) }

// Comparison is a run's ratios against a baseline's.
type Comparison struct {
	Compared int // ratios in both
	// Regressed are the ratios more than 25% above the baseline and above
	// every run it was taken from; Improved more than 25% below it and
	// below every run. By name.
	Regressed, Improved []RatioChange
	// Ratios in one only, by name: this run's that the baseline lacks
	// (new, or zero in the baseline), and the baseline's that this run did
	// not measure (its phase not run).
	NotInBaseline, NotMeasured []string
}

// Compare compares the ratios now with the baseline's. A ratio has
// regressed when it is more than 25% above the baseline's and above the
// highest of the baseline's runs: a ratio whose runs spread wider than
// that (a few plugins at once on 2 cores, where one run's ratio may be
// half again another's) is not reported for a run within its spread.
// Likewise below for an improvement.
func Compare(baseline *Baseline, now map[string]float64) Comparison {
	var c Comparison
	for _, name := range slices.Sorted(maps.Keys(now)) {
		b, v := baseline.Ratios[name], now[name]
		if b <= 0 {
			c.NotInBaseline = append(c.NotInBaseline, name)
			continue
		}
		rng, ok := baseline.Range[name]
		if !ok {
			rng = [2]float64{b, b}
		}
		switch {
		case v > b*(1+regressionMargin) && v > rng[1]:
			c.Regressed = append(c.Regressed, RatioChange{name, b, v, rng})
		case v < b*(1-regressionMargin) && v < rng[0]:
			c.Improved = append(c.Improved, RatioChange{name, b, v, rng})
		}
		c.Compared++
	}
	for _, name := range slices.Sorted(maps.Keys(baseline.Ratios)) {
		if _, ok := now[name]; !ok && baseline.Ratios[name] > 0 {
			c.NotMeasured = append(c.NotMeasured, name)
		}
	}
	return c
}

// HasRegression reports whether a ratio regressed.
func (c Comparison) HasRegression() bool { return len(c.Regressed) > 0 }

// PrintComparison writes c, the comparison of a run on machine run with
// the baseline b read from file, to w. The regressions, when there are any, go to loud too
// (stderr, which is seen when stdout goes to a file or a pipe).
func PrintComparison(w, loud io.Writer, file string, b *Baseline, run Machine, c Comparison) {
	// Ratios move with the machine as well as with the code: a run on
	// another processor than the baseline's says so before its verdict,
	// on both writers when it reports a regression.
	var machine string
	switch now := run.Processor(); {
	case b.Processor == "":
		machine = fmt.Sprintf("Note: %s does not record the processor it was taken on (its machine: %s); this run's is %s. If that is another machine, the ratios can differ by the machine as well as by the code.\n", file, b.Machine, now)
	case b.Processor != now:
		machine = fmt.Sprintf("Note: %s was taken on another processor (%s) than this run's (%s): the ratios can differ by the machine as well as by the code.\n", file, b.Processor, now)
	}
	if machine != "" {
		fmt.Fprint(w, "\n"+machine)
		if c.HasRegression() {
			fmt.Fprint(loud, "\n"+machine)
		}
	}
	against := fmt.Sprintf("%s (%s)", file, b.Date)
	runs := ""
	if b.Runs > 1 {
		against = fmt.Sprintf("%s (%s, median of %d runs)", file, b.Date, b.Runs)
		runs = " and than any of its runs"
	}
	margin := int(regressionMargin * 100)
	switch {
	case c.HasRegression():
		var sb strings.Builder
		fmt.Fprintf(&sb, "!!! REGRESSION: %s more than %d%% worse than %s%s:\n", countRatios(len(c.Regressed)), margin, against, runs)
		writeChanges(&sb, "!!!   ", c.Regressed)
		fmt.Fprint(w, "\n"+sb.String())
		fmt.Fprint(loud, "\n"+sb.String())
	case c.Compared == 0:
		fmt.Fprintf(w, "\nNo ratio compared with %s: the two have none in common.\n", against)
	default:
		fmt.Fprintf(w, "\nNo regression: %d ratios compared with %s, none more than %d%% worse%s.\n", c.Compared, against, margin, runs)
	}
	if len(c.Improved) > 0 {
		fmt.Fprintf(w, "%s more than %d%% better than the baseline%s; consider -write-baseline:\n", countRatios(len(c.Improved)), margin, runs)
		writeChanges(w, "      ", c.Improved)
	}
	if len(c.NotInBaseline) > 0 {
		fmt.Fprintf(w, "Not in the baseline, not compared: %s\n", strings.Join(c.NotInBaseline, ", "))
	}
	if len(c.NotMeasured) > 0 {
		fmt.Fprintf(w, "In the baseline, not measured by this run: %s\n", strings.Join(c.NotMeasured, ", "))
	}
}

// countRatios is "1 ratio is" or "n ratios are".
func countRatios(n int) string {
	if n == 1 {
		return "1 ratio is"
	}
	return fmt.Sprintf("%d ratios are", n)
}

// writeChanges writes one line per change, each after prefix, the names
// aligned.
func writeChanges(w io.Writer, prefix string, changes []RatioChange) {
	width := 0
	for _, c := range changes {
		width = max(width, len(c.Name))
	}
	for _, c := range changes {
		spread := ""
		if c.Range[0] != c.Range[1] {
			spread = fmt.Sprintf(" (runs %.2f–%.2f×)", c.Range[0], c.Range[1])
		}
		fmt.Fprintf(w, "%s%-*s  baseline %.2f×%s  now %.2f×  (%+.0f%%)\n", prefix, width, c.Name, c.Baseline, spread, c.Now, c.percent())
	}
}
