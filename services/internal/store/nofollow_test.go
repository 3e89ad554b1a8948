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
	"github.com/nodeplug/nodeplug/services/internal/atomicfile"
)

// TestSymlinksNotFollowed: a symlink planted at the snapshot's or at a
// journal's path, to a file outside that holds valid content, is neither
// read nor written through. Load moves the link itself aside as it does a
// corrupt file, and the files written next are regular files while the
// target keeps its bytes.
func TestSymlinksNotFollowed(t *testing.T) {
	for _, which := range []string{"snapshot", "journal"} {
		t.Run(which, func(t *testing.T) {
			dir, outside := testutil.TempDir(t), testutil.TempDir(t)
			path, _ := tornJournal(t, dir)
			if which == "snapshot" {
				path = Path(dir)
			}
			victim := filepath.Join(outside, "victim")
			content, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(victim, content, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink(victim, path); err != nil {
				t.Fatal(err)
			}

			j, d, err := open(t, dir, Options{})
			ces := Corruptions(err)
			if len(ces) != 1 || !errors.Is(err, ErrCorrupt) || ces[0].Path != path || !strings.Contains(err.Error(), "symbolic link") {
				t.Fatalf("Load through a symlink: %+v, %v", d, err)
			}
			if d != nil && len(d.Allocations) != 0 {
				t.Fatalf("the link's target was read: %+v", d)
			}
			if target, err := os.Readlink(ces[0].MovedTo); err != nil || target != victim {
				t.Fatalf("moved aside %s: the link itself should be there: %q, %v", ces[0].MovedTo, target, err)
			}
			commit(t, j, Batch{Resources: []Resource{res("example.com/new", "n0")}})
			for _, p := range []string{Path(dir), journalPath(Path(dir), j.num)} {
				if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
					t.Fatalf("%s after a write: %v, %v", p, fi, err)
				}
			}
			if b, err := os.ReadFile(victim); err != nil || !bytes.Equal(b, content) {
				t.Fatalf("the link's target was written: %d bytes, %v", len(b), err)
			}
			if got := mustState(t, dir); len(got.Resources) != 1 || got.Resources[0].Name != "example.com/new" {
				t.Fatalf("state written: %+v", got)
			}
		})
	}
}

// TestNewJournalReplacesPlantedLink: a link planted at the name of the
// next journal is replaced by the journal, not written through.
func TestNewJournalReplacesPlantedLink(t *testing.T) {
	dir, outside := testutil.TempDir(t), testutil.TempDir(t)
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, journalPath(Path(dir), 7)); err != nil {
		t.Fatal(err)
	}
	f, _, err := createJournal(Path(dir), 7, 0)
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if fi, err := os.Lstat(journalPath(Path(dir), 7)); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("journal: %v, %v", fi, err)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep" {
		t.Fatalf("victim: %q, %v", b, err)
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
	f, err := atomicfile.CreateTemp(dir, "t-")
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
