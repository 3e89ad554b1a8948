package reconciler

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeplug/nodeplug/internal/testutil"
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
