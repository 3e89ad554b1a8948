package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteMarkdownFile(t *testing.T) {
	r := &Results{Machine: Machine{CPUs: 2, CPUModel: "Some CPU", GoVersion: "go1.26", Time: "2026-12-03T19:00:00Z"}, Command: "nodeplug-bench -short"}
	r.Floor = []FloorResult{{Kind: "dra", N: 10, RatioTotal: 1.5, Rounds: []FloorRound{{}}}}
	path := filepath.Join(t.TempDir(), "bench.md")
	if err := os.WriteFile(path, []byte("old figures\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err := WriteMarkdownFile(path, r, MarkdownPage{Commit: "abc1234"})
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	for _, want := range []string{
		"- **Measured:** 2026-12-03T19:00:00Z\n",
		"- **Machine:** Some CPU, 2 CPUs, go1.26, ",
		"- **Source:** abc1234\n",
		"- **Command:** `nodeplug-bench -short`\n",
		"```text\nnodeplug-bench  2026-12-03T19:00:00Z  2 CPUs  go1.26\n",
		"dra           N=10",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q:\n%s", want, page)
		}
	}
	if strings.Contains(page, "old figures") {
		t.Error("the old figures are still there")
	}
	if !strings.HasSuffix(page, "```\n") {
		t.Errorf("the table's code block is not closed:\n%s", page)
	}
	// A page that cannot be written is an error.
	if err := WriteMarkdownFile(filepath.Join(t.TempDir(), "no", "such", "bench.md"), r, MarkdownPage{}); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
}

// ReadCPU's parsing takes the first processor's name and identity, and no
// identity when a field of it is missing.
func TestParseCPUInfo(t *testing.T) {
	two := "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\nstepping\t: 1\n\n" +
		"processor\t: 1\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\nmodel name\t: Intel Xeon\nstepping\t: 8\n\n"
	if model, id := parseCPUInfo(two); model != "AMD EPYC" || id != "AuthenticAMD family 25 model 17 stepping 1" {
		t.Errorf("got %q, %q", model, id)
	}
	// An arm64 /proc/cpuinfo names none of them.
	if model, id := parseCPUInfo("processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n\n"); model != "" || id != "" {
		t.Errorf("without the fields: %q, %q", model, id)
	}
	if _, id := parseCPUInfo("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel name\t: AMD EPYC\n"); id != "" {
		t.Errorf("without model and stepping: id %q", id)
	}
}
