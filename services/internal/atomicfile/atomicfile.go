// Package atomicfile writes a file whole or not at all, and durably: a
// temporary file beside it, fsync, rename over the file, fsync of the
// directory. A reader sees the old content or the new, never a part; after
// a crash the file holds what the last completed write put there.
//
// The devicemanager's and the dramanager's checkpoints (package store) and
// the reconciler's registrations file are written through it.
package atomicfile

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// WriteFile writes data to path atomically and durably, mode 0600. The
// temporary file is named <dir>/.<base>.tmp-<random> (TempPrefix); one
// left by a crash is garbage to remove (RemoveTemps).
func WriteFile(path string, data []byte) error {
	f, err := CreateTemp(filepath.Dir(path), TempPrefix(path))
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		Discard(f)
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	return Install(f, path)
}

// TempPrefix is the name prefix of WriteFile's temporary files for path.
func TempPrefix(path string) string { return "." + filepath.Base(path) + ".tmp-" }

// RemoveTemps removes the files in dir whose names start with one of
// prefixes: the temporary files a crash left (TempPrefix of a path
// WriteFile writes, or the prefix given to CreateTemp).
func RemoveTemps(dir string, prefixes ...string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(e.Name(), p) }) {
			_ = os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// Install makes the temporary file f durable and renames it over path:
// fsync, close, rename (which replaces whatever is at path, a symlink
// included, rather than writing through it), fsync of the directory. On
// failure the temporary file is removed.
func Install(f *os.File, path string) error {
	if err := f.Sync(); err != nil {
		Discard(f)
		return fmt.Errorf("fsync %s: %w", f.Name(), err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("close %s: %w", f.Name(), err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("rename %s into place: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// Discard closes and removes the temporary file f.
func Discard(f *os.File) {
	_ = f.Close()
	_ = os.Remove(f.Name())
}

// CreateTemp creates a new file dir/<prefix><random>, mode 0600, opened for
// writing with O_EXCL and O_NOFOLLOW: it never opens an existing file or
// follows a link planted at its name.
func CreateTemp(dir, prefix string) (*os.File, error) {
	for range 100 {
		var rnd [8]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, err
		}
		name := filepath.Join(dir, prefix+hex.EncodeToString(rnd[:]))
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		// The mode is exactly 0600, whatever the umask.
		if err := f.Chmod(0o600); err != nil {
			Discard(f)
			return nil, err
		}
		return f, nil
	}
	return nil, fmt.Errorf("create a temporary file in %s: too many name collisions", dir)
}

// SyncDir fsyncs the directory dir, so that a rename or a removal in it
// is durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
