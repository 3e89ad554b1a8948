// Package unixsock holds the Unix socket helpers every service uses: socket
// identity (the generation), confinement of endpoints to allowed directories,
// and listeners with safe permissions.
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// MaxPathLen is the longest path a Unix socket address can hold on Linux
// (sun_path is 108 bytes including the terminating NUL).
const MaxPathLen = 107

// Identity identifies one socket file: it changes when the file is recreated
// and survives chmod and chown.
type Identity struct {
	Dev   uint64
	Ino   uint64
	Birth int64 // birth time in ns, 0 when the filesystem has none
	Mtime int64 // modification time in ns, used when Birth is 0
}

// Generation renders the identity as an opaque string.
func (id Identity) Generation() string {
	if id.Birth != 0 {
		return fmt.Sprintf("%x:%x:b%d", id.Dev, id.Ino, id.Birth)
	}
	return fmt.Sprintf("%x:%x:m%d", id.Dev, id.Ino, id.Mtime)
}

// Stat returns the identity and mode of the file at path, following symlinks.
func Stat(path string) (Identity, fs.FileMode, error) {
	id, mode, err := statx(unix.AT_FDCWD, path, 0)
	if err != nil {
		return Identity{}, 0, &fs.PathError{Op: "statx", Path: path, Err: err}
	}
	return id, mode, nil
}

// statx is Stat of path relative to dirfd, with statx(2)'s flags.
func statx(dirfd int, path string, flags int) (Identity, fs.FileMode, error) {
	var stx unix.Statx_t
	err := unix.Statx(dirfd, path, flags|unix.AT_STATX_SYNC_AS_STAT,
		unix.STATX_TYPE|unix.STATX_INO|unix.STATX_BTIME|unix.STATX_MTIME, &stx)
	if err != nil {
		return Identity{}, 0, err
	}
	id := Identity{
		Dev:   unix.Mkdev(stx.Dev_major, stx.Dev_minor),
		Ino:   stx.Ino,
		Mtime: stx.Mtime.Sec*1e9 + int64(stx.Mtime.Nsec),
	}
	if stx.Mask&unix.STATX_BTIME != 0 {
		id.Birth = stx.Btime.Sec*1e9 + int64(stx.Btime.Nsec)
	}
	var mode fs.FileMode
	switch stx.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
		mode = fs.ModeSocket
	case unix.S_IFDIR:
		mode = fs.ModeDir
	case unix.S_IFLNK:
		mode = fs.ModeSymlink
	case unix.S_IFIFO:
		mode = fs.ModeNamedPipe
	case unix.S_IFREG:
		mode = 0
	default:
		mode = fs.ModeIrregular
	}
	return id, mode | fs.FileMode(stx.Mode&0o777), nil
}

// IsSocket reports whether path is (or links to) a Unix socket.
func IsSocket(path string) bool {
	_, mode, err := Stat(path)
	return err == nil && mode&fs.ModeSocket != 0
}

// Confiner decides which paths may be dialled: those that resolve, after
// following symlinks, inside one of its directories.
type Confiner struct {
	dirs []string // absolute, cleaned, symlinks resolved where possible
}

// NewConfiner returns a Confiner for the given directories. Relative
// directories are made absolute.
func NewConfiner(dirs []string) (*Confiner, error) {
	c := &Confiner{}
	for _, d := range dirs {
		if d == "" {
			continue
		}
		abs, err := filepath.Abs(d)
		if err != nil {
			return nil, fmt.Errorf("allowed directory %q: %w", d, err)
		}
		c.dirs = append(c.dirs, abs)
		if r, err := filepath.EvalSymlinks(abs); err == nil && r != abs {
			c.dirs = append(c.dirs, r)
		}
	}
	if len(c.dirs) == 0 {
		return nil, fmt.Errorf("no allowed endpoint directory: %w", errdefs.ErrInvalidArgument)
	}
	return c, nil
}

// Within reports whether the cleaned absolute path p lies inside an allowed
// directory (without touching the filesystem).
func (c *Confiner) Within(p string) bool {
	for _, d := range c.dirs {
		if p == d || strings.HasPrefix(p, strings.TrimSuffix(d, string(filepath.Separator))+string(filepath.Separator)) {
			return true
		}
	}
	return false
}

// Resolve checks that path is absolute, has no ".." component, and resolves
// (following symlinks) inside an allowed directory. It returns the resolved
// path. Errors wrap errdefs.ErrInvalidArgument.
func (c *Confiner) Resolve(path string) (string, error) {
	clean, err := c.checkName(path)
	if err != nil {
		return "", err
	}
	// A path with no symlink in any component resolves to itself: one
	// open that follows none settles it, where EvalSymlinks would look at
	// each component in turn.
	if fd, _, plain, err := openPlain(clean); plain && err == nil {
		_ = unix.Close(fd)
		return clean, nil
	}
	return c.evalInside(path, clean)
}

// checkName is what Resolve checks of path by its name alone: absolute, no
// ".." component, inside an allowed directory once cleaned. It returns the
// clean path.
func (c *Confiner) checkName(path string) (string, error) {
	if !filepath.IsAbs(path) {
		return "", fmt.Errorf("endpoint %q is not an absolute path: %w", path, errdefs.ErrInvalidArgument)
	}
	for _, part := range strings.Split(path, string(filepath.Separator)) {
		if part == ".." {
			return "", fmt.Errorf("endpoint %q contains \"..\": %w", path, errdefs.ErrInvalidArgument)
		}
	}
	clean := filepath.Clean(path)
	if !c.Within(clean) {
		return "", fmt.Errorf("endpoint %q is outside the allowed directories %v: %w", path, c.dirs, errdefs.ErrInvalidArgument)
	}
	return clean, nil
}

// evalInside resolves clean, path's checked name, symlinks followed, and
// checks the result is inside an allowed directory.
func (c *Confiner) evalInside(path, clean string) (string, error) {
	resolved, err := filepath.EvalSymlinks(clean)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("endpoint %q does not exist: %w", path, errdefs.ErrInvalidArgument)
		}
		return "", fmt.Errorf("endpoint %q: %v: %w", path, err, errdefs.ErrInvalidArgument)
	}
	if !c.Within(resolved) {
		return "", fmt.Errorf("endpoint %q resolves to %q, outside the allowed directories %v: %w", path, resolved, c.dirs, errdefs.ErrInvalidArgument)
	}
	return resolved, nil
}

// Listen creates a Unix socket listener at path with mode 0600 (see
// ListenMode).
func Listen(path string) (net.Listener, error) { return ListenMode(path, 0o600, -1) }

// ListenMode creates a Unix socket listener at path with the given mode and,
// when gid >= 0, that group, removing a stale socket first. The parent
// directory is created with mode 0750 when missing.
//
// The socket never appears at path with another mode, and the process umask
// is left alone (other goroutines may be creating files): it is bound in a
// private directory beside path, given its mode and group there, and renamed
// into place. Closing the listener removes the socket, unless it was
// replaced since.
func ListenMode(path string, mode fs.FileMode, gid int) (net.Listener, error) {
	if len(path) > MaxPathLen {
		return nil, fmt.Errorf("socket path %q is %d bytes, longer than the %d-byte limit: %w", path, len(path), MaxPathLen, errdefs.ErrInvalidArgument)
	}
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	private, err := os.MkdirTemp(dir, ".s")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(private)
	bind := filepath.Join(private, "s")
	if len(bind) > MaxPathLen {
		// No room for the private directory: bind in place. The socket
		// then has the umask's mode until the chmod below; the directory
		// (0750) still keeps strangers out.
		bind = path
	}
	l, err := net.Listen("unix", bind)
	if err != nil {
		return nil, err
	}
	ul := l.(*net.UnixListener)
	// The socket is removed by our Close, at its final path.
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (net.Listener, error) {
		_ = ul.Close()
		_ = os.Remove(bind)
		return nil, err
	}
	if err := os.Chmod(bind, mode); err != nil {
		return fail(err)
	}
	if gid >= 0 {
		if err := os.Lchown(bind, -1, gid); err != nil {
			return fail(fmt.Errorf("set the group of %s to %d: %w", path, gid, err))
		}
	}
	if bind != path {
		if err := os.Rename(bind, path); err != nil {
			return fail(err)
		}
	}
	id, _, err := Stat(path)
	if err != nil {
		return fail(err)
	}
	if bind != path {
		boundNames.Store(bind, path)
	}
	return &listener{UnixListener: ul, path: path, bound: bind, id: id}, nil
}

// boundNames maps the name each open ListenMode socket was bound with to
// its path, where the two differ (see ServedPath).
var boundNames sync.Map

// ServedPath returns the path of an open ListenMode socket of this process
// given the name it was bound with, which is what the kernel reports as the
// address of its connections (a connection's LocalAddr on the server side):
// the socket is bound in a private directory and renamed into place.
func ServedPath(bound string) (string, bool) {
	v, ok := boundNames.Load(bound)
	if !ok {
		return "", false
	}
	return v.(string), true
}

// listener is a Unix listener whose socket was renamed into place.
type listener struct {
	*net.UnixListener
	path  string
	bound string // the name it was bound with
	id    Identity

	once sync.Once
	err  error
}

// Addr returns the socket's final path.
func (l *listener) Addr() net.Addr { return &net.UnixAddr{Name: l.path, Net: "unix"} }

// Close stops listening and removes the socket, unless another socket has
// replaced it at the path since.
func (l *listener) Close() error {
	l.once.Do(func() {
		l.err = l.UnixListener.Close()
		boundNames.CompareAndDelete(l.bound, l.path)
		if id, _, err := Stat(l.path); err == nil && id == l.id {
			_ = os.Remove(l.path)
		}
	})
	return l.err
}
