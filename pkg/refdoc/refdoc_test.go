package refdoc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFirstDifference(t *testing.T) {
	for _, tc := range []struct {
		name, a, b   string
		line         int
		lineA, lineB string
	}{
		{"same", "x\ny\n", "x\ny\n", 0, "", ""},
		{"changed line", "x\ny\nz\n", "x\nY\nz\n", 2, `"y\n"`, `"Y\n"`},
		{"line added", "x\n", "x\ny\n", 2, "(end of file)", `"y\n"`},
		{"line removed", "x\ny\n", "x\n", 2, `"y\n"`, "(end of file)"},
		{"final newline", "x\n", "x", 1, `"x\n"`, `"x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, a, b, differ := FirstDifference([]byte(tc.a), []byte(tc.b))
			if differ != (tc.line != 0) || line != tc.line || a != tc.lineA || b != tc.lineB {
				t.Errorf("FirstDifference = %d %s %s %v, want %d %s %s", line, a, b, differ, tc.line, tc.lineA, tc.lineB)
			}
		})
	}
}

// TestCompareStale: a stale file is an error that says to run make docs
// and shows the first line that differs.
func TestCompareStale(t *testing.T) {
	committed := "# Title\n| `--a` | int |\n| `--b` | bool |\n"
	generated := "# Title\n| `--a` | int |\n| `--c` | bool |\n"
	err := Compare("docs/reference/x.md", []byte(committed), []byte(generated))
	if err == nil {
		t.Fatal("a stale file passes")
	}
	for _, want := range []string{"docs/reference/x.md is stale", "run `make docs`", "line 3", "| `--b` | bool |", "| `--c` | bool |"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q has no %q", err, want)
		}
	}
	if err := Compare("x.md", []byte(committed), []byte(committed)); err != nil {
		t.Errorf("the same file: %v", err)
	}
}

// TestCheck: Check compares with the file beneath the module root, and
// with UpdateEnv=1 writes it instead.
func TestCheck(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "pkg", "a"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Chdir(filepath.Join(root, "pkg", "a"))
	t.Setenv(UpdateEnv, "")
	if err := Check("docs/ref.md", []byte("new\n")); err == nil || !strings.Contains(err.Error(), "docs/ref.md is missing: run `make docs`") {
		t.Errorf("missing file: %v", err)
	}
	t.Setenv(UpdateEnv, "1")
	if err := Check("docs/ref.md", []byte("new\n")); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "docs", "ref.md")); err != nil || string(b) != "new\n" {
		t.Fatalf("written: %q, %v", b, err)
	}
	t.Setenv(UpdateEnv, "")
	if err := Check("docs/ref.md", []byte("new\n")); err != nil {
		t.Errorf("current file: %v", err)
	}
	if err := Check("docs/ref.md", []byte("newer\n")); err == nil || !strings.Contains(err.Error(), "stale") {
		t.Errorf("stale file: %v", err)
	}
}

// TestCheckStable: a render that depends on HOME fails, naming the file.
func TestCheckStable(t *testing.T) {
	t.Setenv(UpdateEnv, "1")
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(root)
	err := CheckStable("ref.md", t, func() (string, error) { return "default " + os.Getenv("HOME") + "\n", nil })
	if err == nil || !strings.Contains(err.Error(), "ref.md depends on HOME") {
		t.Errorf("a render with HOME in it: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "ref.md")); err == nil {
		t.Error("an unstable render was written")
	}
	if err := CheckStable("ref.md", t, func() (string, error) { return "stable\n", nil }); err != nil {
		t.Errorf("a stable render: %v", err)
	}
}

func TestMarkdown(t *testing.T) {
	for in, want := range map[string]string{
		"a|b <x> *y* `z` \\": "a\\|b \\<x> \\*y\\* \\`z\\` \\\\",
	} {
		if got := Cell(in); got != want {
			t.Errorf("Cell(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{"": "", "a|b": "`a\\|b`", "a`b": "`` a`b ``", "x": "`x`"} {
		if got := CodeCell(in); got != want {
			t.Errorf("CodeCell(%q) = %q, want %q", in, got, want)
		}
	}
	if got, want := Table([]string{"A", "B"}, [][]string{{"1", "2"}}), "| A | B |\n| --- | --- |\n| 1 | 2 |\n"; got != want {
		t.Errorf("Table = %q, want %q", got, want)
	}
}
