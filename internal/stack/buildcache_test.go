package stack

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// copyModule copies the files sourceKey reads of a tiny module into a new
// directory and returns it.
func tinyModule(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/tiny\n\ngo 1.24\n")
	write("go.sum", "")
	write("cmd/a/main.go", "package main\n\nimport \"example.com/tiny/lib\"\n\nfunc main() { lib.F() }\n")
	write("lib/lib.go", "package lib\n\n// F does nothing.\nfunc F() {}\n")
	write("lib/lib_test.go", "package lib\n")
	return dir
}

func TestSourceKeyFollowsTheSources(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	ctx := context.Background()
	dir := tinyModule(t)
	key := func() string {
		t.Helper()
		k, err := sourceKey(ctx, dir, []string{"./cmd/a"})
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	k1 := key()
	if k2 := key(); k2 != k1 {
		t.Fatalf("the same sources gave two keys: %s, %s", k1, k2)
	}
	// A test file is not built into the binary: the key stays.
	if err := os.WriteFile(filepath.Join(dir, "lib/lib_test.go"), []byte("package lib\n\n// changed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if k := key(); k != k1 {
		t.Error("a change to a test file changed the key")
	}
	// A change to a dependency's source changes it.
	if err := os.WriteFile(filepath.Join(dir, "lib/lib.go"), []byte("package lib\n\n// F does little.\nfunc F() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	k3 := key()
	if k3 == k1 {
		t.Fatal("a change to a dependency's source kept the key")
	}
	// So does a new file in a package.
	if err := os.WriteFile(filepath.Join(dir, "lib/more.go"), []byte("package lib\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if k := key(); k == k3 {
		t.Error("a new source file kept the key")
	}
}

func TestPruneKeepsTheRecentAndTheBusy(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-2 * binCacheIdle)
	mk := func(name string, used time.Time) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(filepath.Join(dir, name), used, used); err != nil {
			t.Fatal(err)
		}
	}
	mk("current", old.Add(-time.Hour)) // the one just used: kept whatever its time
	mk("recent1", old.Add(time.Minute))
	mk("recent2", old)
	mk("stale", old.Add(-time.Minute))
	mk("busy", time.Now()) // used a moment ago by another process
	pruneBinCache(dir, "current")
	for name, want := range map[string]bool{"current": true, "busy": true, "recent1": true, "recent2": false, "stale": false} {
		_, err := os.Stat(filepath.Join(dir, name))
		if got := err == nil; got != want {
			t.Errorf("%s kept: %v, want %v", name, got, want)
		}
	}
}
