package app

import (
	"os"
	"path/filepath"
	"testing"
)

// A relative root dir, from the command line or the environment, is made
// absolute against the working directory; an absolute one and the default
// are kept as they are.
func TestAbsPathVar(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{nil, "", "/var/lib/kubelet"},
		{[]string{"--root-dir", ".run/root"}, "", filepath.Join(dir, ".run", "root")},
		{[]string{"--root-dir", "/srv/np"}, "", "/srv/np"},
		{nil, "envroot/x", filepath.Join(dir, "envroot", "x")},
		{[]string{"--root-dir", "a/../b"}, "envroot", filepath.Join(dir, "b")},
	} {
		t.Setenv("NODEPLUG_ROOT_DIR", tc.env)
		if tc.env == "" {
			_ = os.Unsetenv("NODEPLUG_ROOT_DIR") // restored by Setenv's cleanup
		}
		fs := NewFlags("watcher")
		var root string
		AbsPathVar(fs.FlagSet, &root, "root-dir", "/var/lib/kubelet", "root directory")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if root != tc.want {
			t.Errorf("args %q, NODEPLUG_ROOT_DIR=%q: root %q, want %q", tc.args, tc.env, root, tc.want)
		}
	}
}
