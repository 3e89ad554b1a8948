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
func TestConnectConfined(t *testing.T) { bothOpens(t, testConnectConfined) }

// bothOpens runs test with openat2(2), and with the walk one component at a
// time that stands in for it where the kernel lacks it.
func bothOpens(t *testing.T, test func(t *testing.T)) {
	for _, walk := range []bool{false, true} {
		name := "openat2"
		if walk {
			name = "walk"
		}
		t.Run(name, func(t *testing.T) {
			old := noOpenat2.Load()
			noOpenat2.Store(walk)
			t.Cleanup(func() { noOpenat2.Store(old) })
			test(t)
		})
	}
}

func testConnectConfined(t *testing.T) {
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
	file := filepath.Join(allowed, "file")
	_, _, err = c.Connect(file)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Connect of a regular file = %v, want ECONNREFUSED", err)
	}
	// The error names the endpoint, not the descriptor it was reached by.
	var op *net.OpError
	if !errors.As(err, &op) || op.Addr == nil || op.Addr.String() != file || strings.Contains(err.Error(), "/proc/") {
		t.Errorf("Connect of a regular file: %v, want a *net.OpError naming %s", err, file)
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
func TestConnectSwapRace(t *testing.T) { bothOpens(t, testConnectSwapRace) }

func testConnectSwapRace(t *testing.T) {
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

// FuzzConfinerConnect: whatever path under the allowed directory Connect
// is given — through symlink chains, directory symlinks in and out,
// relative symlinks that climb out, a loop — it connects the socket inside
// or nothing: never the socket outside, which is reachable by following
// several of the links.
func FuzzConfinerConnect(f *testing.F) {
	dir, err := os.MkdirTemp("", "npfz")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = os.RemoveAll(dir) })
	allowed, outside := filepath.Join(dir, "allowed"), filepath.Join(dir, "outside")
	for _, d := range []string{filepath.Join(allowed, "sub"), outside} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			f.Fatal(err)
		}
	}
	var listeners []net.Listener
	for _, p := range []string{filepath.Join(allowed, "in.sock"), filepath.Join(outside, "victim.sock")} {
		l, err := Listen(p)
		if err != nil {
			f.Fatal(err)
		}
		listeners = append(listeners, l)
	}
	f.Cleanup(func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	})
	links := map[string]string{
		"allowed/sub/rel-in":  "../in.sock",
		"allowed/sub/rel-out": "../../outside/victim.sock",
		"allowed/lnk":         filepath.Join(outside, "victim.sock"),
		"allowed/outdir":      outside,
		"allowed/indir":       "sub",
		"allowed/chain1":      "chain2",
		"allowed/chain2":      "in.sock",
		"allowed/chainout1":   "chainout2",
		"allowed/chainout2":   filepath.Join(outside, "victim.sock"),
		"allowed/loop":        "loop",
		"outside/back":        filepath.Join(allowed, "in.sock"),
		"outside/backdir":     allowed,
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			f.Fatal(err)
		}
	}
	c, err := NewConfiner([]string{allowed})
	if err != nil {
		f.Fatal(err)
	}
	in, _, err := Stat(filepath.Join(allowed, "in.sock"))
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"in.sock", "sub/rel-in", "sub/rel-out", "lnk", "outdir/victim.sock", "outdir/back", "outdir/backdir/in.sock",
		"indir/rel-in", "indir/rel-out", "chain1", "chainout1", "loop", "../outside/victim.sock", "sub/../in.sock", "", "a\x00b",
	} {
		f.Add(s)
	}
	for _, s := range []string{"in.sock", "sub/rel-in", "chain1", "outdir/back"} {
		for swap := range uint8(3) {
			f.Add(s + "\x00" + string(rune('0'+swap)))
		}
	}
	f.Fuzz(func(t *testing.T, input string) {
		rel, swap, _ := strings.Cut(input, "\x00")
		// An odd length of rel takes the walk that stands in for openat2.
		old := noOpenat2.Load()
		noOpenat2.Store(len(rel)%2 == 1)
		defer noOpenat2.Store(old)
		if swap != "" {
			undo := swapAfterCheck(t, swap[0]%3, filepath.Join(outside, "victim.sock"))
			defer undo()
		}
		conn, id, err := c.Connect(allowed + "/" + rel)
		if err != nil {
			return
		}
		_ = conn.Close()
		if id.Key() != in.Key() {
			t.Fatalf("Connect(%q) connected %v, not the socket inside (%v)", rel, id.Key(), in.Key())
		}
	})
}

// swapAfterCheck makes the next Connect meet a swap right after its check,
// in the window a two-step check and dial would leave: how 1 renames a
// symlink to victim over the resolved socket, how 2 over its directory
// (a symlink to victim's). how 0 changes nothing. The returned func puts
// everything back.
func swapAfterCheck(t *testing.T, how byte, victim string) (undo func()) {
	var restore []func()
	testHookResolved = func(resolved string) {
		testHookResolved = nil
		target, link := victim, resolved
		switch how {
		case 0:
			return
		case 2:
			target, link = filepath.Dir(victim), filepath.Dir(resolved)
		}
		moved := link + ".moved"
		if err := os.Rename(link, moved); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		restore = append(restore, func() {
			if err := os.Remove(link); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(moved, link); err != nil {
				t.Fatal(err)
			}
		})
	}
	return func() {
		testHookResolved = nil
		for _, r := range restore {
			r()
		}
	}
}

// deepDir makes a short temporary directory (a socket's path must fit
// sun_path) with four directories under it, and returns both.
func deepDir(b *testing.B) (dir, deep string) {
	dir, err := os.MkdirTemp("", "npb")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	deep = filepath.Join(dir, "a", "b", "c", "d")
	if err := os.MkdirAll(deep, 0o750); err != nil {
		b.Fatal(err)
	}
	return dir, deep
}

// BenchmarkConnectRefused is what one redial of a socket that refuses
// costs (the bind→listen gap, a stale socket): unconfined (a nil Confiner:
// open, statx, socket, connect) and confined (the check and the walk as
// well), four directories deep.
func BenchmarkConnectRefused(b *testing.B) {
	dir, deep := deepDir(b)
	path := filepath.Join(deep, "stale.sock")
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unix.Close(fd) })
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		b.Fatal(err)
	}
	c, err := NewConfiner([]string{dir})
	if err != nil {
		b.Fatal(err)
	}
	for name, conf := range map[string]*Confiner{"unconfined": nil, "confined": c} {
		b.Run(name, func(b *testing.B) {
			for b.Loop() {
				if _, _, err := conf.Connect(path); !errors.Is(err, syscall.ECONNREFUSED) {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkConnect is what one connect to a listening socket costs, four
// directories deep, the connection closed again: confined and unconfined
// Connect beside a plain net.Dial of the path, which checks nothing.
func BenchmarkConnect(b *testing.B) {
	dir, deep := deepDir(b)
	path := filepath.Join(deep, "live.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			_ = conn.Close()
		}
	}()
	c, err := NewConfiner([]string{dir})
	if err != nil {
		b.Fatal(err)
	}
	connect := func(conf *Confiner) func() (net.Conn, error) {
		return func() (net.Conn, error) {
			conn, _, err := conf.Connect(path)
			return conn, err
		}
	}
	for _, bc := range []struct {
		name string
		dial func() (net.Conn, error)
	}{
		{"net.Dial", func() (net.Conn, error) { return net.Dial("unix", path) }},
		{"unconfined", connect(nil)},
		{"confined", connect(c)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				conn, err := bc.dial()
				if err != nil {
					b.Fatal(err)
				}
				_ = conn.Close()
			}
		})
	}
}
