package manager

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// busySocket listens at path with a backlog of zero and fills it with
// connections nobody accepts, so that the next connect fails with EAGAIN
// rather than ECONNREFUSED: a live socket that cannot take a connection
// now. It is a plain socket listening as a busy kubelet's would.
func busySocket(t *testing.T, path string) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		c, err := net.Dial("unix", path)
		if errors.Is(err, syscall.EAGAIN) {
			return
		}
		if err != nil {
			t.Fatalf("filling the backlog of %s: %v", path, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if i == 64 {
			t.Fatalf("the backlog of %s never filled", path)
		}
	}
}

// TestOpenStopsWhenKubeletSockCannotBeJudged: only ECONNREFUSED makes
// kubelet.sock stale. A socket whose backlog is full (EAGAIN) or that the
// process may not connect to (EACCES) may belong to a live kubelet: Open
// fails naming the socket and why, and removes nothing, neither
// kubelet.sock nor the stale plugin sockets beside it.
func TestOpenStopsWhenKubeletSockCannotBeJudged(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string)
		errno syscall.Errno
	}{
		{"full backlog", busySocket, syscall.EAGAIN},
		{"no permission", func(t *testing.T, path string) {
			if os.Geteuid() == 0 {
				t.Skip("root connects to a socket of mode 0; the full-backlog case covers a dial error other than ECONNREFUSED")
			}
			rudeSocket(t, path)
			if err := os.Chmod(path, 0); err != nil {
				t.Fatal(err)
			}
		}, syscall.EACCES},
		// Root connects to any socket, so the kernel never answers it
		// EACCES: the dial is made to, for every socket there, as it
		// answers a non-root devicemanager on a socket of mode 0.
		{"no permission, as any user", func(t *testing.T, path string) {
			rudeSocket(t, path)
			denyDials(t)
		}, syscall.EACCES},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.TempDir(t)
			kubelet := KubeletSocketPath(dir)
			tc.setup(t, kubelet)
			stale := filepath.Join(dir, "stale.sock")
			testutil.StaleSocket(t, stale)

			m, err := Open(context.Background(), config(dir))
			if err == nil {
				_ = m.Close()
				t.Fatal("Open succeeded beside a kubelet.sock it could not judge")
			}
			if errors.Is(err, ErrKubeletRunning) || !errors.Is(err, tc.errno) {
				t.Fatalf("Open: %v; want an error wrapping %v", err, tc.errno)
			}
			for _, p := range []string{kubelet, stale} {
				if !exists(p) {
					t.Errorf("%s was removed", p)
				}
			}
			if exists(filepath.Join(dir, "nodeplug_checkpoint")) {
				t.Error("a checkpoint was written although the start stopped")
			}
		})
	}
}

// denyDials makes every dial at start fail with EACCES until the test
// ends, as connect(2) fails for a user without write permission on the
// socket.
func denyDials(t *testing.T) {
	t.Helper()
	orig, origStale := dialSocket, dialStale
	dialSocket = func(path string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: "unix", Addr: &net.UnixAddr{Name: path, Net: "unix"}, Err: os.NewSyscallError("connect", syscall.EACCES)}
	}
	dialStale = func(_ *unixsock.Confiner, path string) (net.Conn, error) { return dialSocket(path) }
	t.Cleanup(func() { dialSocket, dialStale = orig, origStale })
}

// TestStaleSocketsNotJudgedByEACCES: a plugin socket the devicemanager may
// not connect to is not stale: with kubelet.sock gone, Open starts and
// leaves it in place (only ECONNREFUSED makes a socket stale).
func TestStaleSocketsNotJudgedByEACCES(t *testing.T) {
	dir := testutil.TempDir(t)
	denied := filepath.Join(dir, "denied.sock")
	rudeSocket(t, denied)
	denyDials(t)
	m, err := Open(context.Background(), config(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close() }()
	if !exists(denied) {
		t.Fatal("a socket that answered EACCES was removed as stale")
	}
}

// TestStaleCheckNeverFollowsASwap (issue 25, N1): a socket in
// device-plugins that a symlink to a socket outside replaces after the
// directory was read, right before the stale check dials it, is not
// followed: the socket outside receives no connection, and what is there
// now is not removed as stale.
func TestStaleCheckNeverFollowsASwap(t *testing.T) {
	dir, outside := testutil.TempDir(t), testutil.TempDir(t)
	victim, err := unixsock.Listen(filepath.Join(outside, "victim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	swapped := filepath.Join(dir, "swapped.sock")
	testutil.StaleSocket(t, swapped)
	orig := dialStale
	var dialled error
	dialStale = func(conf *unixsock.Confiner, path string) (net.Conn, error) {
		if path != swapped {
			return orig(conf, path)
		}
		tmp := filepath.Join(dir, ".swap")
		if err := os.Symlink(victim.Addr().String(), tmp); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, swapped); err != nil {
			return nil, err
		}
		c, err := orig(conf, path)
		if c != nil {
			_ = c.Close()
		}
		dialled = err
		return c, err
	}
	t.Cleanup(func() { dialStale = orig })
	if err := removeStaleSockets(dir, nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(dialled, errdefs.ErrInvalidArgument) {
		t.Fatalf("the stale check's dial after the swap: %v; want it refused", dialled)
	}
	if fi, err := os.Lstat(swapped); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("what replaced the socket was removed or changed: %v, %v", fi, err)
	}
}
