package unixsock

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// acceptCounter serves a listener, counting and closing what it accepts.
type acceptCounter struct {
	l net.Listener
	n atomic.Int64
}

func countAccepts(t *testing.T, l net.Listener) *acceptCounter {
	t.Helper()
	a := &acceptCounter{l: l}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			a.n.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = l.Close(); <-done })
	return a
}

func listenAt(t *testing.T, path string) net.Listener {
	t.Helper()
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestConnectConfined: Connect reaches a socket inside the allowed
// directories, directly or through a symlink that stays inside; it refuses
// a symlink leading out (and the socket there is never connected), a
// "..", a relative path; a file that is no socket is refused as the kernel
// refuses it; the identity returned is the socket's; a socket whose path
// is longer than sun_path holds is reached all the same.
func TestConnectConfined(t *testing.T) {
	allowed, outside := tempDir(t), tempDir(t)
	c, err := NewConfiner([]string{allowed})
	if err != nil {
		t.Fatal(err)
	}
	in := filepath.Join(allowed, "in.sock")
	inside := countAccepts(t, listenAt(t, in))
	victim := countAccepts(t, listenAt(t, filepath.Join(outside, "victim.sock")))
	if err := os.Symlink(in, filepath.Join(allowed, "alias.sock")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(outside, "victim.sock"), filepath.Join(allowed, "escape.sock")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(allowed, "outdir")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(allowed, "file"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want, _, err := Stat(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{in, filepath.Join(allowed, "alias.sock")} {
		conn, id, err := c.Connect(p)
		if err != nil {
			t.Fatalf("Connect(%s): %v", p, err)
		}
		_ = conn.Close()
		if id.Key() != want.Key() {
			t.Errorf("Connect(%s) identity %v, want %v", p, id.Key(), want.Key())
		}
	}
	for _, p := range []string{
		filepath.Join(allowed, "escape.sock"), filepath.Join(allowed, "outdir", "victim.sock"),
		allowed + "/../" + filepath.Base(outside) + "/victim.sock", "in.sock", filepath.Join(outside, "victim.sock"),
	} {
		if _, _, err := c.Connect(p); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Connect(%s) = %v, want an InvalidArgument refusal", p, err)
		}
	}
	if _, _, err := c.Connect(filepath.Join(allowed, "file")); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Connect of a regular file = %v, want ECONNREFUSED", err)
	}

	deep := allowed
	for len(deep) < 2*MaxPathLen {
		deep = filepath.Join(deep, strings.Repeat("d", 40))
	}
	if err := os.MkdirAll(deep, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(in, filepath.Join(deep, "far.sock")); err != nil {
		t.Fatal(err)
	}
	conn, _, err := c.Connect(filepath.Join(deep, "far.sock"))
	if err != nil {
		t.Fatalf("a path longer than sun_path: %v", err)
	}
	_ = conn.Close()

	waitAccepts(t, inside, 3)
	if n := victim.n.Load(); n != 0 {
		t.Fatalf("the socket outside received %d connections", n)
	}
}

func waitAccepts(t *testing.T, a *acceptCounter, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	for a.n.Load() < n {
		if ctx.Err() != nil {
			t.Fatalf("%d connections accepted, want %d", a.n.Load(), n)
		}
		waitTick()
	}
}

// TestConnectSwapRace loops the swap of N1 (issue 25): an endpoint inside
// the allowed directory — a live socket, or one bound but not listening —
// has a symlink to a socket outside renamed over it while Connect and a
// pinned Dialer dial it over and over. The socket outside never receives a
// connection, and a pinned dialer never connects to another socket than
// the one it pinned.
func TestConnectSwapRace(t *testing.T) {
	for _, listening := range []bool{true, false} {
		name := "listening"
		if !listening {
			name = "bound, not listening"
		}
		t.Run(name, func(t *testing.T) {
			allowed, outside := tempDir(t), tempDir(t)
			c, err := NewConfiner([]string{allowed})
			if err != nil {
				t.Fatal(err)
			}
			victim := countAccepts(t, listenAt(t, filepath.Join(outside, "victim.sock")))
			ep := filepath.Join(allowed, "ep.sock")
			var connected atomic.Int64
			for round := range 50 {
				var first Identity
				if listening {
					l := listenAt(t, ep)
					countAccepts(t, l)
					first, _, _ = Stat(ep)
				} else {
					boundNotListening(t, ep)
				}
				pin := NewPin(first)
				dial := c.Dialer(ep, pin)
				stop := make(chan struct{})
				var wg sync.WaitGroup
				for range 2 {
					wg.Go(func() {
						for {
							select {
							case <-stop:
								return
							default:
							}
							if conn, _, err := c.Connect(ep); err == nil {
								connected.Add(1)
								_ = conn.Close()
							}
							if conn, err := dial(context.Background(), ""); err == nil {
								_ = conn.Close()
							}
						}
					})
				}
				tmp := filepath.Join(allowed, ".swap")
				if err := os.Symlink(filepath.Join(outside, "victim.sock"), tmp); err != nil {
					t.Fatal(err)
				}
				if err := os.Rename(tmp, ep); err != nil {
					t.Fatal(err)
				}
				// A few dials after the swap, then the next round.
				for i := 0; i < 20; i++ {
					if conn, err := dial(context.Background(), ""); err == nil {
						_ = conn.Close()
						t.Fatalf("round %d: the pinned dialer connected after the swap", round)
					}
				}
				close(stop)
				wg.Wait()
				if err := os.Remove(ep); err != nil {
					t.Fatal(err)
				}
			}
			if n := victim.n.Load(); n != 0 {
				t.Fatalf("the socket outside received %d connections", n)
			}
			if listening && connected.Load() == 0 {
				t.Fatal("no dial reached the socket inside: the race proves nothing")
			}
		})
	}
}

// TestPin: a pinned dialer refuses another socket at its path (the plugin
// started anew), with ErrUnavailable; an unset pin takes the first socket.
func TestPin(t *testing.T) {
	dir := tempDir(t)
	c, err := NewConfiner([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "p.sock")
	l := listenAt(t, p)
	countAccepts(t, l)
	pin := NewPin(Identity{})
	dial := c.Dialer(p, pin)
	conn, err := dial(context.Background(), "ignored")
	if err != nil {
		t.Fatal(err)
	}
	_ = conn.Close()
	id, _, _ := Stat(p)
	if pin.Identity() != id {
		t.Fatalf("pin %v, want %v", pin.Identity(), id)
	}
	_ = l.Close()
	countAccepts(t, listenAt(t, p))
	if _, err := dial(context.Background(), ""); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "another socket") {
		t.Fatalf("dial of a new socket at the pinned path: %v, want ErrUnavailable", err)
	}
	if conn, err := c.Dialer(p, nil)(context.Background(), ""); err != nil {
		t.Fatalf("an unpinned dialer: %v", err)
	} else {
		_ = conn.Close()
	}
}

const testDeadline = waitDeadline

// waitTick is the pause between two looks of a poll.
func waitTick() { time.Sleep(time.Millisecond) }

// boundNotListening binds a socket at path and never listens on it, as a
// plugin between its bind() and its listen(); it is closed when the test
// ends (the file stays until removed).
func boundNotListening(t *testing.T, path string) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
}
