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
// improvement worth a new baseline.
const regressionMargin = 0.25

// Baseline is a run's ratios (Results.Ratios) kept in a file, for later
// runs to be compared with.
type Baseline struct {
	Date    string             `json:"date"`    // when the run was, YYYY-MM-DD (UTC)
	Machine string             `json:"machine"` // what it ran on (MachineDescription)
	Note    string             `json:"note"`    // how it was made, for whoever reads the file
	Ratios  map[string]float64 `json:"ratios"`
}

// NewBaseline is r's ratios as a baseline dated today, described by note.
func NewBaseline(r *Results, note string) *Baseline {
	return &Baseline{
		Date:    time.Now().UTC().Format(time.DateOnly),
		Machine: MachineDescription(r.Machine),
		Note:    note,
		Ratios:  maps.Clone(r.Ratios),
	}
}

// MachineDescription describes the machine of m in one line: its CPUs, the
// Go version and the kernel as uname reports it.
func MachineDescription(m Machine) string {
	kernel := "unknown kernel"
	var u unix.Utsname
	if err := unix.Uname(&u); err == nil {
		kernel = fmt.Sprintf("%s %s %s", unix.ByteSliceToString(u.Sysname[:]), unix.ByteSliceToString(u.Release[:]), unix.ByteSliceToString(u.Machine[:]))
	}
	return fmt.Sprintf("%d CPUs, %s, %s", m.CPUs, m.GoVersion, kernel)
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
}

// percent is the change from the baseline, in percent of it.
func (c RatioChange) percent() float64 { return 100 * (c.Now/c.Baseline - 1) }

// Comparison is a run's ratios against a baseline's.
type Comparison struct {
	Compared  int           // ratios in both
	Regressed []RatioChange // more than 25% above the baseline, by name
	Improved  []RatioChange // more than 25% below it, by name
	// Ratios in one only, by name: this run's that the baseline lacks
	// (new, or zero in the baseline), and the baseline's that this run did
	// not measure (its phase not run).
	NotInBaseline, NotMeasured []string
}

// Compare compares the ratios now with those of a baseline.
func Compare(baseline, now map[string]float64) Comparison {
	var c Comparison
	for _, name := range slices.Sorted(maps.Keys(now)) {
		b, v := baseline[name], now[name]
		switch {
		case b <= 0:
			c.NotInBaseline = append(c.NotInBaseline, name)
			continue
		case v > b*(1+regressionMargin):
			c.Regressed = append(c.Regressed, RatioChange{name, b, v})
		case v < b*(1-regressionMargin):
			c.Improved = append(c.Improved, RatioChange{name, b, v})
		}
		c.Compared++
	}
	for _, name := range slices.Sorted(maps.Keys(baseline)) {
		if _, ok := now[name]; !ok && baseline[name] > 0 {
			c.NotMeasured = append(c.NotMeasured, name)
		}
	}
	return c
}

// HasRegression reports whether a ratio regressed.
func (c Comparison) HasRegression() bool { return len(c.Regressed) > 0 }

// PrintComparison writes c, a run's comparison with the baseline b read
// from file, to w. The regressions, when there are any, go to loud too
// (stderr, which is seen when stdout goes to a file or a pipe).
func PrintComparison(w, loud io.Writer, file string, b *Baseline, c Comparison) {
	against := fmt.Sprintf("%s (%s)", file, b.Date)
	margin := int(regressionMargin * 100)
	switch {
	case c.HasRegression():
		var sb strings.Builder
		fmt.Fprintf(&sb, "!!! REGRESSION: %s more than %d%% worse than %s:\n", countRatios(len(c.Regressed)), margin, against)
		writeChanges(&sb, "!!!   ", c.Regressed)
		fmt.Fprint(w, "\n"+sb.String())
		fmt.Fprint(loud, "\n"+sb.String())
	case c.Compared == 0:
		fmt.Fprintf(w, "\nNo ratio compared with %s: the two have none in common.\n", against)
	default:
		fmt.Fprintf(w, "\nNo regression: %d ratios compared with %s, none more than %d%% worse.\n", c.Compared, against, margin)
	}
	if len(c.Improved) > 0 {
		fmt.Fprintf(w, "%s more than %d%% better than the baseline; consider -write-baseline:\n", countRatios(len(c.Improved)), margin)
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
		fmt.Fprintf(w, "%s%-*s  baseline %.2f×  now %.2f×  (%+.0f%%)\n", prefix, width, c.Name, c.Baseline, c.Now, c.percent())
	}
}
