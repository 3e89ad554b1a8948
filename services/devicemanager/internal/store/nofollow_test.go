package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// TestCheckpointSymlinkNotFollowed: a symlink planted at the checkpoint
// path, to a file outside that holds a valid checkpoint, is neither read
// nor written through. Load moves the link itself aside as it does a
// corrupt file, and the next write puts a regular file in its place while
// the target keeps its bytes.
func TestCheckpointSymlinkNotFollowed(t *testing.T) {
	dir, outside := testutil.TempDir(t), testutil.TempDir(t)
	victim := filepath.Join(outside, "victim")
	content, err := marshal(sample())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(victim, content, 0o600); err != nil {
		t.Fatal(err)
	}
	s := NewCheckpoint(dir)
	if err := os.Symlink(victim, s.Location()); err != nil {
		t.Fatal(err)
	}

	d, err := s.Load()
	var ce *CorruptError
	if d != nil || !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("Load through a symlink: %+v, %v", d, err)
	}
	if target, err := os.Readlink(ce.MovedTo); err != nil || target != victim {
		t.Fatalf("moved aside %s: the link itself should be there: %q, %v", ce.MovedTo, target, err)
	}
	if _, err := os.Lstat(s.Location()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the link is still at the checkpoint path: %v", err)
	}

	// A link planted again before the first write is replaced, not
	// written through.
	if err := os.Symlink(victim, s.Location()); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(Batch{Resources: []Resource{res("example.com/new", "n0")}}); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(s.Location()); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Fatalf("checkpoint after the write: %v, %v", fi, err)
	}
	if b, err := os.ReadFile(victim); err != nil || !bytes.Equal(b, content) {
		t.Fatalf("the link's target was written: %d bytes, %v", len(b), err)
	}
	if got, err := ReadFile(s.Location()); err != nil || len(got.Resources) != 1 || got.Resources[0].Name != "example.com/new" {
		t.Fatalf("checkpoint written: %+v, %v", got, err)
	}
}

// TestReadFileRefusesNonRegular: a FIFO or a directory at the checkpoint
// path is corrupt; opening the FIFO does not block.
func TestReadFileRefusesNonRegular(t *testing.T) {
	dir := testutil.TempDir(t)
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{fifo, sub} {
		if d, err := ReadFile(p); d != nil || !errors.Is(err, ErrCorrupt) {
			t.Errorf("ReadFile(%s) = %v, %v; want ErrCorrupt", p, d, err)
		}
	}
}

// TestCreateTempRefusesLinks: the temporary file is never opened through a
// symlink, even one that names it exactly.
func TestCreateTempRefusesLinks(t *testing.T) {
	dir := testutil.TempDir(t)
	f, err := createTemp(dir, "t-")
	if err != nil {
		t.Fatal(err)
	}
	name := f.Name()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(name); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("temporary file: %v, %v", fi, err)
	}
	// What createTemp's open does with a link at the name it picked.
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(name); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, name); err != nil {
		t.Fatal(err)
	}
	if _, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600); !errors.Is(err, os.ErrExist) {
		t.Fatalf("open over a link: %v, want EEXIST", err)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Fatalf("victim: %q, %v", b, err)
	}
}
