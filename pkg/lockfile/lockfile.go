// Package lockfile takes an exclusive flock on a file so that only one
// instance of a service runs per root directory.
package lockfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrLocked is returned when another process holds the lock.
var ErrLocked = errors.New("lock is held by another process")

// Lock is a held lock file.
type Lock struct{ f *os.File }

// maxHolder bounds what is read of the file to name the holder's pid.
const maxHolder = 32

// Acquire takes an exclusive, non-blocking flock on path, creating the file if
// needed, and writes the caller's PID into it. The lock is released by Release
// or when the process exits (including SIGKILL).
//
// The file is opened without following a symlink and must be a regular
// file: a link planted at path (to /etc/shadow, say) is refused, never
// truncated and written through, and a FIFO does not block the start.
func Acquire(path string) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0o600)
	if errors.Is(err, syscall.ELOOP) {
		return nil, fmt.Errorf("lock file %s is a symbolic link, not followed: remove it", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err) // err names the path
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("stat lock file %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("lock file %s is not a regular file (%s): remove it", path, fi.Mode().Type())
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := io.ReadAll(io.NewSectionReader(f, 0, maxHolder))
		_ = f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("%s (pid %s): %w", path, strings.TrimSpace(string(holder)), ErrLocked)
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
