// Package lockfile takes an exclusive flock on a file so that only one
// instance of a service runs per root directory.
package lockfile

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// ErrLocked is returned when another process holds the lock.
var ErrLocked = errors.New("lock is held by another process")

// Lock is a held lock file.
type Lock struct{ f *os.File }

// Acquire takes an exclusive, non-blocking flock on path, creating the file if
// needed, and writes the caller's PID into it. The lock is released by Release
// or when the process exits (including SIGKILL).
func Acquire(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock file %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s (pid %s): %w", path, string(holder), ErrLocked)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())), 0)
	}
	return &Lock{f: f}, nil
}

// Release drops the lock. The file stays, so the next holder reuses it.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close()
	l.f = nil
	return err
}
