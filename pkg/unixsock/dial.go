package unixsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// Key is what an endpoint is (DESIGN "Identity"): its socket's device and
// inode. Every path to one socket (a hard link, a symlink) has its Key.
type Key struct{ Dev, Ino uint64 }

// Key returns the socket's device and inode.
func (id Identity) Key() Key { return Key{Dev: id.Dev, Ino: id.Ino} }

// IsZero reports whether k is no socket's.
func (k Key) IsZero() bool { return k == Key{} }

// String renders k as "<dev>:<ino>" in hex, as Generation starts.
func (k Key) String() string { return fmt.Sprintf("%x:%x", k.Dev, k.Ino) }

// Identify checks path as Connect does, opens what is there without
// connecting, and returns the path it resolved to and the identity of the
// file found there. A nil Confiner confines nothing.
func (c *Confiner) Identify(path string) (string, Identity, error) {
	fd, resolved, id, err := c.open(path)
	if err != nil {
		return "", Identity{}, err
	}
	_ = unix.Close(fd)
	return resolved, id, nil
}

// Connect checks path and connects to the very socket it checked, with no
// window between the two in which a rename could put another file there:
//
//  1. Resolve: path is absolute, has no ".." and resolves, symlinks
//     followed, inside the allowed directories (a path with no symlink in
//     it needs no resolution: it is inside by its name);
//  2. the resolved path is opened (O_PATH) without following any symlink
//     in any component — openat2(RESOLVE_NO_SYMLINKS), or one component
//     at a time from "/" with O_NOFOLLOW where the kernel lacks it — so the
//     file held is the one at the resolved path, whatever was renamed
//     where since step 1 looked (a symlink found there now is looked at
//     once more, from step 1, and then refused);
//  3. a non-blocking socket connects through /proc/self/fd/N of that
//     descriptor, which names that inode only (and is short, whatever the
//     length of the path).
//
// A Unix socket answers a connect at once: the error of a socket that
// nothing listens on wraps syscall.ECONNREFUSED, one whose backlog is
// full syscall.EAGAIN (a file that is no socket is refused by the kernel
// too); they are *net.OpError values naming path. A path that is not
// allowed fails with Resolve's errors (errdefs.ErrInvalidArgument).
//
// A nil Confiner confines nothing: path is opened following symlinks, and
// the file opened is still the file connected. Connect returns the
// identity of the socket connected. It is safe for concurrent use.
func (c *Confiner) Connect(path string) (net.Conn, Identity, error) {
	fd, _, id, err := c.open(path)
	if err != nil {
		return nil, Identity{}, err
	}
	defer unix.Close(fd)
	conn, err := connectFD(path, fd)
	if err != nil {
		return nil, Identity{}, err
	}
	return conn, id, nil
}

// Dialer returns the dialer of the endpoint at path for
// grpc.WithContextDialer (the address gRPC passes is ignored): every call
// — the first connect and every reconnect after a GOAWAY or a broken
// connection — is a Connect of path. With a pin, it also refuses a socket
// other than the pinned one (see Pin): one connection serves one
// endpoint. A nil Confiner confines nothing, as in Connect.
func (c *Confiner) Dialer(path string, pin *Pin) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		conn, id, err := c.Connect(path)
		if err != nil {
			return nil, err
		}
		if err := pin.check(path, id); err != nil {
			_ = conn.Close()
			return nil, err
		}
		return conn, nil
	}
}

// Pin holds the identity of the socket one connection is to: its device
// and inode, and its birth time (or mtime), so that a socket recreated on
// a reused inode is another one, as its Generation is. The first dial sets
// it, unless NewPin did; a later dial that finds another socket at the
// path (its plugin started anew, or something was renamed there) is
// refused with an error wrapping errdefs.ErrUnavailable: that socket is
// another endpoint, which registers on its own. A nil *Pin pins nothing.
// It is safe for concurrent use.
type Pin struct {
	mu  sync.Mutex
	id  Identity
	set bool
}

// NewPin returns a pin already set to id (a zero id: unset).
func NewPin(id Identity) *Pin { return &Pin{id: id, set: id != Identity{}} }

// Identity returns the pinned identity, zero while unset.
func (p *Pin) Identity() Identity {
	if p == nil {
		return Identity{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.id
}

func (p *Pin) check(path string, id Identity) error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !p.set:
		p.id, p.set = id, true
	case p.id.Generation() != id.Generation():
		return fmt.Errorf("endpoint %s is now another socket (%s, was %s): %w", bounds.Quote(path), id.Generation(), p.id.Generation(), errdefs.ErrUnavailable)
	}
	return nil
}

// open resolves path (Resolve) and opens what is at the resolved path
// without following any symlink (see Connect); a path with no symlink in
// it is opened so at once. It returns an O_PATH
// descriptor, which the caller closes, the resolved path and the identity
// of the file opened.
func (c *Confiner) open(path string) (int, string, Identity, error) {
	if c == nil {
		fd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, "", Identity{}, dialError(path, "open", err)
		}
		fd, resolved, id, _, err := identified(fd, path)
		return fd, resolved, id, err
	}
	clean, err := c.checkName(path)
	if err != nil {
		return -1, "", Identity{}, err
	}
	// A path with no symlink in it is inside by its name: one open that
	// follows no symlink settles it, with no resolution first.
	if fd, id, plain, err := openPlain(clean); plain {
		return fd, clean, id, err
	}
	// A symlink on the way, or nothing there: resolve, then open the
	// resolved path the same way.
	var changed error
	for range 2 {
		resolved, err := c.evalInside(path, clean)
		if err != nil {
			return -1, "", Identity{}, err
		}
		if testHookResolved != nil {
			testHookResolved(resolved)
		}
		fd, err := openNoFollow(resolved)
		if err == nil {
			var id Identity
			var mode fs.FileMode
			if fd, resolved, id, mode, err = identified(fd, resolved); err != nil || mode&fs.ModeSymlink == 0 {
				return fd, resolved, id, err
			}
			// The last component is a symlink now.
			_ = unix.Close(fd)
			err = fmt.Errorf("%s: %w", resolved, errChanged)
		}
		if !errors.Is(err, errChanged) {
			return -1, "", Identity{}, dialError(path, "open", err)
		}
		changed = err
	}
	return -1, "", Identity{}, fmt.Errorf("endpoint %s keeps changing while it is checked: %w: %w", bounds.Quote(path), changed, errdefs.ErrInvalidArgument)
}

// openPlain opens clean, a checked name (checkName), when no component of
// it is a symlink, following none: the file held is the one at that name,
// and the name is its resolution. plain is false, with nothing open and no
// error, when a symlink is on the way or nothing is there; the caller then
// resolves the path. An error (with plain) is the identity's that could
// not be read.
func openPlain(clean string) (fd int, id Identity, plain bool, err error) {
	fd, err = openNoFollow(clean)
	if err != nil {
		return -1, Identity{}, false, nil
	}
	fd, _, id, mode, err := identified(fd, clean)
	if err != nil {
		return -1, Identity{}, true, err
	}
	if mode&fs.ModeSymlink != 0 {
		_ = unix.Close(fd)
		return -1, Identity{}, false, nil
	}
	return fd, id, true, nil
}

// testHookResolved, when set (by tests only), runs between the check of a
// path and its opening: where a rename would land in a window.
var testHookResolved func(resolved string)

// identified returns fd with the identity and mode of its file.
func identified(fd int, resolved string) (int, string, Identity, fs.FileMode, error) {
	id, mode, err := statx(fd, "", unix.AT_EMPTY_PATH)
	if err != nil {
		_ = unix.Close(fd)
		return -1, "", Identity{}, 0, &fs.PathError{Op: "statx", Path: resolved, Err: err}
	}
	return fd, resolved, id, mode, nil
}

// errChanged: a component of a resolved path was a symlink (or no longer
// a directory) when it was opened.
var errChanged = errors.New("a component became a symlink")

// noOpenat2 is set once openat2(2) turned out to be missing (an old
// kernel, or a seccomp profile that refuses it).
var noOpenat2 atomic.Bool

// openNoFollow opens the clean absolute path resolved, which had no
// symlink when it was resolved, without following any symlink: with
// openat2(RESOLVE_NO_SYMLINKS) in one call where the kernel has it, else
// one component at a time from "/" (O_NOFOLLOW; O_DIRECTORY for all but
// the last component). It fails with errChanged when it meets a symlink
// on the way; a symlink as the last component is opened itself (O_PATH
// with O_NOFOLLOW), and the caller refuses it.
func openNoFollow(resolved string) (int, error) {
	if !noOpenat2.Load() {
		fd, err := unix.Openat2(unix.AT_FDCWD, resolved, &unix.OpenHow{
			Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
		})
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM):
			noOpenat2.Store(true)
		case errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR):
			return -1, fmt.Errorf("%s: %w", resolved, errChanged)
		default:
			return -1, err
		}
	}
	return walkNoFollow(resolved)
}

// walkNoFollow is openNoFollow one component at a time.
func walkNoFollow(resolved string) (int, error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	parts := strings.Split(strings.TrimPrefix(resolved, "/"), "/")
	for i, part := range parts {
		if part == "" {
			continue
		}
		last := i == len(parts)-1
		flags := unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC
		if !last {
			flags |= unix.O_DIRECTORY
		}
		next, err := unix.Openat(fd, part, flags, 0)
		_ = unix.Close(fd)
		if err != nil {
			if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				err = fmt.Errorf("%s: %w", "/"+strings.Join(parts[:i+1], "/"), errChanged)
			}
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// connectFD connects a Unix stream socket to the socket that fd (an
// O_PATH descriptor) holds, through /proc/self/fd/N: the kernel resolves
// that name to fd's inode only. It is net's own dial of that name (one
// socket, one connect, registered with the poller), with no descriptor
// duplicated; the connection's remote address is the name the server
// bound, as for any Unix connection. Errors name path, the endpoint as
// given.
func connectFD(path string, fd int) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.Dial("unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		var op *net.OpError
		if errors.As(err, &op) {
			// The same error, naming the endpoint instead of the
			// descriptor's name, which means nothing once it is closed.
			named := *op
			named.Addr = &net.UnixAddr{Name: path, Net: "unix"}
			return nil, &named
		}
		return nil, dialError(path, "connect", err)
	}
	return conn, nil
}

func dialError(path, op string, err error) error {
	return &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"}, Err: os.NewSyscallError(op, err)}
}
