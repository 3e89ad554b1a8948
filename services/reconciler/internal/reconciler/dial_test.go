package reconciler

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// dialListening redials a socket that refuses connections through the
// window (a socket bound, then listening), fails with the refusal once the
// window is over (a stale socket), and fails at once when there is no
// socket at all.
func TestDialListening(t *testing.T) {
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()

	t.Run("listens within the window", func(t *testing.T) {
		path := filepath.Join(dir, "late.sock")
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), path)
		defer f.Close()
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			t.Fatal(err)
		}
		type result struct {
			c   net.Conn
			err error
		}
		done := make(chan result, 1)
		go func() {
			c, err := dialListening(nil, path, testutil.Deadline)(ctx, "")
			done <- result{c, err}
		}()
		if err := unix.Listen(fd, 8); err != nil {
			t.Fatal(err)
		}
		r := <-done
		if r.err != nil {
			t.Fatalf("dial: %v", r.err)
		}
		_ = r.c.Close()
	})

	t.Run("stale socket", func(t *testing.T) {
		path := filepath.Join(dir, "stale.sock")
		testutil.StaleSocket(t, path)
		_, err := dialListening(nil, path, time.Millisecond)(ctx, "")
		if !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "refuses connections") {
			t.Fatalf("dial of a stale socket: %v", err)
		}
	})

	t.Run("no socket", func(t *testing.T) {
		_, err := dialListening(nil, filepath.Join(dir, "missing.sock"), testutil.Deadline)(ctx, "")
		if !errors.Is(err, syscall.ENOENT) {
			t.Fatalf("dial of a missing socket: %v", err)
		}
	})
}

// TestDialListeningConfined (issue 25, N1): a registration socket bound but
// not yet listening, inside the allowed directory, has a symlink to a
// socket outside renamed over it while the dialer redials it through the
// bind→listen gap. The redial checks again and fails; the socket outside
// never receives a connection. A symlink that stays inside is dialled.
func TestDialListeningConfined(t *testing.T) {
	allowed, outside := testutil.TempDir(t), testutil.TempDir(t)
	c, err := unixsock.NewConfiner([]string{allowed})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	victim, err := unixsock.Listen(filepath.Join(outside, "victim.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	var reached atomic.Int64
	go func() {
		for {
			conn, err := victim.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			_ = conn.Close()
		}
	}()
	for round := range 20 {
		path := filepath.Join(allowed, "gap.sock")
		fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			conn, err := dialListening(c, path, testutil.Deadline)(ctx, "")
			if err == nil {
				_ = conn.Close()
			}
			done <- err
		}()
		tmp := filepath.Join(allowed, ".swap")
		if err := os.Symlink(victim.Addr().String(), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), path) {
			t.Fatalf("round %d: dial after the swap: %v; want a refusal naming %s", round, err, path)
		}
		_ = unix.Close(fd)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
	}
	if n := reached.Load(); n != 0 {
		t.Fatalf("the socket outside received %d connections", n)
	}

	in, err := unixsock.Listen(filepath.Join(allowed, "in.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	if err := os.Symlink(in.Addr().String(), filepath.Join(allowed, "alias.sock")); err != nil {
		t.Fatal(err)
	}
	conn, err := dialListening(c, filepath.Join(allowed, "alias.sock"), 0)(ctx, "")
	if err != nil {
		t.Fatalf("a symlink inside: %v", err)
	}
	_ = conn.Close()
}
