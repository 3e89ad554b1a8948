package unixsock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

func tempDir(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp("", "np")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(d) })
	return d
}

func TestGenerationSurvivesChmodChangesOnRecreate(t *testing.T) {
	dir := tempDir(t)
	p := filepath.Join(dir, "a.sock")
	l, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	id1, mode, err := Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if mode&os.ModeSocket == 0 || mode.Perm() != 0o600 {
		t.Fatalf("mode = %v, want socket 0600", mode)
	}
	if err := os.Chmod(p, 0o660); err != nil {
		t.Fatal(err)
	}
	id2, _, _ := Stat(p)
	if id1.Generation() != id2.Generation() {
		t.Fatalf("chmod changed generation: %s -> %s", id1.Generation(), id2.Generation())
	}
	_ = l.Close()
	_ = os.Remove(p)
	l, err = Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	id3, _, _ := Stat(p)
	if id3.Generation() == id1.Generation() {
		t.Fatalf("recreated socket kept generation %s", id1.Generation())
	}
}

// TestConfinerResolve checks what Resolve accepts, and that what it
// returns is the path with every symlink followed, whether it takes the
// one-open way (no symlink on the path) or resolves component by
// component (a symlinked file or directory on the way).
func TestConfinerResolve(t *testing.T) { bothOpens(t, testConfinerResolve) }

func testConfinerResolve(t *testing.T) {
	allowed := tempDir(t)
	outside := tempDir(t)
	in := filepath.Join(allowed, "in.sock")
	out := filepath.Join(outside, "out.sock")
	for _, p := range []string{in, out} {
		l, err := net.Listen("unix", p)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	linkOut := filepath.Join(allowed, "escape.sock")
	if err := os.Symlink(out, linkOut); err != nil {
		t.Fatal(err)
	}
	linkIn := filepath.Join(allowed, "alias.sock")
	if err := os.Symlink(in, linkIn); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(allowed, "sub")
	if err := os.Mkdir(sub, 0o750); err != nil {
		t.Fatal(err)
	}
	deep := filepath.Join(sub, "deep.sock")
	l, err := net.Listen("unix", deep)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dirLink := filepath.Join(allowed, "dirlink")
	if err := os.Symlink(sub, dirLink); err != nil {
		t.Fatal(err)
	}
	c, err := NewConfiner([]string{allowed})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{in, true},
		{linkIn, true},
		{deep, true},
		{filepath.Join(dirLink, "deep.sock"), true},
		{allowed + "/./sub//deep.sock", true}, // not clean: Resolve cleans it
		{out, false},
		{linkOut, false},
		{filepath.Join(allowed, "..", filepath.Base(outside), "out.sock"), false},
		{"relative.sock", false},
		{filepath.Join(allowed, "missing.sock"), false},
	} {
		got, err := c.Resolve(tc.path)
		if tc.ok && err != nil {
			t.Errorf("Resolve(%s): %v", tc.path, err)
		}
		if tc.ok && err == nil {
			want, err := filepath.EvalSymlinks(tc.path)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("Resolve(%s) = %s, want %s", tc.path, got, want)
			}
		}
		if !tc.ok && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Resolve(%s) = %v, want ErrInvalidArgument", tc.path, err)
		}
	}
}

func TestListenRejectsLongPath(t *testing.T) {
	dir := tempDir(t)
	long := filepath.Join(dir, string(make([]byte, 0))+filepath.Base(dir))
	for len(long) <= MaxPathLen {
		long += "x"
	}
	if _, err := Listen(long); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("Listen(long) = %v, want ErrInvalidArgument", err)
	}
}

// TestListenModeAndGroup: the socket gets its mode and group, the process
// umask is left alone, and Close removes the socket unless it was replaced.
func TestListenModeAndGroup(t *testing.T) {
	dir := tempDir(t)
	p := filepath.Join(dir, "sub", "api.sock")
	before := unix.Umask(0o022)
	unix.Umask(before)
	l, err := ListenMode(p, 0o660, os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	after := unix.Umask(before)
	if after != before {
		t.Errorf("umask changed from %o to %o", before, after)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Errorf("mode = %v, want socket 0660", fi.Mode())
	}
	if l.Addr().String() != p {
		t.Errorf("Addr = %q, want %q", l.Addr(), p)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Errorf("the private bind directory was left behind: %v", entries)
	}
	c, err := net.Dial("unix", p)
	if err != nil {
		t.Fatalf("dial the renamed socket: %v", err)
	}
	_ = c.Close()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Close left the socket: %v", err)
	}

	// A socket that replaced ours is not removed by our Close.
	l1, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	_ = l1.Close()
	if !IsSocket(p) {
		t.Error("closing the replaced listener removed its successor's socket")
	}
}

// TestListenLongestPath binds a 107-byte path, where the private directory
// does not fit.
func TestListenLongestPath(t *testing.T) {
	dir := tempDir(t)
	p := filepath.Join(dir, strings.Repeat("l", MaxPathLen-len(dir)-1))
	l, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, mode, err := Stat(p)
	if err != nil || mode.Perm() != 0o600 {
		t.Fatalf("mode %v, %v", mode, err)
	}
}

// TestConfinerRootAllowsEverything: an allowed dir of "/" allows every
// absolute path (it used to allow nothing: "/" + "/" was the prefix).
func TestConfinerRootAllowsEverything(t *testing.T) {
	c, err := NewConfiner([]string{"/"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/", "/tmp/x.sock", "/var/lib/kubelet/plugins_registry/a.sock"} {
		if !c.Within(p) {
			t.Errorf("Within(%q) = false under /", p)
		}
	}
	dir := tempDir(t)
	sock := filepath.Join(dir, "a.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := c.Resolve(sock); err != nil {
		t.Errorf("Resolve(%q) under /: %v", sock, err)
	}
}

// FuzzConfinerResolve: whatever the path, Resolve does not panic, and what
// it accepts lies inside the allowed directory once symlinks are followed.
func FuzzConfinerResolve(f *testing.F) {
	dir, err := os.MkdirTemp("", "npfz")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = os.RemoveAll(dir) })
	allowed := filepath.Join(dir, "allowed")
	outside := filepath.Join(dir, "outside")
	for _, d := range []string{allowed, outside} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			f.Fatal(err)
		}
	}
	for _, name := range []string{"in.sock", "lnk#x"} {
		l, err := Listen(filepath.Join(allowed, name))
		if err != nil {
			f.Fatal(err)
		}
		f.Cleanup(func() { _ = l.Close() })
	}
	lo, err := Listen(filepath.Join(outside, "victim.sock"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = lo.Close() })
	if err := os.Symlink(filepath.Join(outside, "victim.sock"), filepath.Join(allowed, "lnk")); err != nil {
		f.Fatal(err)
	}
	c, err := NewConfiner([]string{allowed})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"in.sock", "lnk", "lnk#x", "../outside/victim.sock", "%2E%2E%2Foutside%2Fvictim.sock", "", "/", "a\x00b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		p := allowed + "/" + rel
		resolved, err := c.Resolve(p)
		if err != nil {
			return
		}
		real, err := filepath.EvalSymlinks(resolved)
		if err != nil {
			return // removed meanwhile: nothing to dial
		}
		if !c.Within(real) {
			t.Fatalf("Resolve(%q) accepted %q, outside %s", p, real, allowed)
		}
	})
}
