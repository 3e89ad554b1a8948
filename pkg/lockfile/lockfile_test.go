package lockfile

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestAcquireExclusive(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	l, err := Acquire(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Acquire(p); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Acquire: got %v, want ErrLocked", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(p)
	if err != nil {
		t.Fatalf("Acquire after Release: %v", err)
	}
	_ = l2.Release()
}

// TestAcquireDoesNotFollowLinks: a symlink planted at the lock path is
// refused, and its target is neither truncated nor written; a FIFO there
// neither blocks nor is taken.
func TestAcquireDoesNotFollowLinks(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "shadow")
	const content = "root:$6$secret:19000:0:99999:7:::\n"
	if err := os.WriteFile(victim, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "nodeplug-devicemanager.lock")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	if l, err := Acquire(link); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		_ = l.Release()
		t.Fatalf("Acquire of a symlink: %v, want it refused as a link", err)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != content {
		t.Fatalf("the link's target changed: %q, %v", b, err)
	}

	// A dangling link is not created through either.
	dangling := filepath.Join(dir, "dangling.lock")
	if err := os.Symlink(filepath.Join(dir, "created-through"), dangling); err != nil {
		t.Fatal(err)
	}
	if l, err := Acquire(dangling); err == nil {
		_ = l.Release()
		t.Fatal("Acquire of a dangling symlink succeeded")
	}
	if _, err := os.Lstat(filepath.Join(dir, "created-through")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a file was created through the dangling link: %v", err)
	}

	fifo := filepath.Join(dir, "fifo.lock")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := Acquire(fifo); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		_ = l.Release()
		t.Fatalf("Acquire of a FIFO: %v, want it refused", err)
	}
}

// TestLockedNamesTheHolder: the refusal names the pid written by the
// holder.
func TestLockedNamesTheHolder(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	l, err := Acquire(p)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Release() }()
	_, err = Acquire(p)
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())+")") {
		t.Fatalf("second Acquire: %v, want ErrLocked naming pid %d", err, os.Getpid())
	}
}
