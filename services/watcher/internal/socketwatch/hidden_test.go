package socketwatch

import (
	"path/filepath"
	"strings"
	"testing"
)

// hiddenOracle is the rule of the watcher-events contract, written
// independently of hiddenBelow: p, cleaned, counts when it is dir or below
// it and no component below dir starts with ".".
func hiddenOracle(dir, p string) bool {
	c := filepath.Clean(p)
	if c == dir {
		return false
	}
	rest, ok := strings.CutPrefix(c, dir+"/")
	if !ok {
		return true
	}
	for _, part := range strings.Split(rest, "/") {
		if strings.HasPrefix(part, ".") {
			return true
		}
	}
	return false
}

// FuzzHiddenPath checks the rule for what does not count (any component
// below the watched directory that starts with ".", or a path outside it)
// against an independent statement of it, for paths inside the directory
// (dir joined with the input) and for any other path (the input itself).
func FuzzHiddenPath(f *testing.F) {
	for _, seed := range []string{
		"a.sock", ".a.sock", "x/.y/z.sock", "x/y/z.sock", "..", "../reg/a.sock", "../regx/a.sock",
		"./a.sock", "x/../.a.sock", "x//y.sock", "", ".", "...", "a/..b", "/etc/passwd",
		"/var/lib/kubelet/plugins_registry/a.sock", "/var/lib/kubelet/plugins_registry_x/a.sock",
		"/var/lib/kubelet/plugins_registry/.h/a.sock", "relative/a.sock", "a\x00b", "%2E%2E/a.sock",
	} {
		f.Add(seed)
	}
	const dir = "/var/lib/kubelet/plugins_registry"
	f.Fuzz(func(t *testing.T, in string) {
		for _, p := range []string{filepath.Clean(filepath.Join(dir, in)), filepath.Clean(in)} {
			if got, want := hiddenBelow(dir, p), hiddenOracle(dir, p); got != want {
				t.Fatalf("hiddenBelow(%q, %q) = %v, want %v", dir, p, got, want)
			}
		}
	})
}
