package unixsock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

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

func TestConfinerResolve(t *testing.T) {
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
		{out, false},
		{linkOut, false},
		{filepath.Join(allowed, "..", filepath.Base(outside), "out.sock"), false},
		{"relative.sock", false},
		{filepath.Join(allowed, "missing.sock"), false},
	} {
		_, err := c.Resolve(tc.path)
		if tc.ok && err != nil {
			t.Errorf("Resolve(%s): %v", tc.path, err)
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
