package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// notifySocket is the service manager's end of sd_notify: a datagram
// socket, as systemd binds it, whose messages the test reads in order.
type notifySocket struct {
	conn  *net.UnixConn
	mu    sync.Mutex
	msgs  []string
	syncs int // markers sent by sync
}

func listenNotify(t *testing.T) *notifySocket {
	t.Helper()
	path := filepath.Join(testutil.TempDir(t), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	n := &notifySocket{conn: conn}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			k, err := conn.Read(buf)
			if err != nil {
				return
			}
			n.mu.Lock()
			n.msgs = append(n.msgs, string(buf[:k]))
			n.mu.Unlock()
		}
	}()
	t.Cleanup(func() { _ = conn.Close(); <-done })
	t.Setenv("NOTIFY_SOCKET", path)
	return n
}

// sync waits until every message sent before it has been read. What a
// service sends is in the socket's queue once its send returns, but the
// reader takes it later; the queue of a datagram socket is one FIFO, so
// once a marker the test sends after them is read, so are they.
func (n *notifySocket) sync(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	n.syncs++
	marker := fmt.Sprintf("X_TEST_SYNC=%d", n.syncs)
	n.mu.Unlock()
	c, err := net.DialUnix("unixgram", nil, n.conn.LocalAddr().(*net.UnixAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(marker)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the notify socket read up to "+marker, func() error {
		if n.count(marker) == 0 {
			return fmt.Errorf("not yet: %q", n.messages())
		}
		return nil
	})
}

func (n *notifySocket) messages() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.msgs...)
}

// count is how many messages so far hold the line want.
func (n *notifySocket) count(want string) int {
	c := 0
	for _, m := range n.messages() {
		if hasLine(m, want) {
			c++
		}
	}
	return c
}

func hasLine(msg, line string) bool {
	for l := range strings.SplitSeq(msg, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// TestSystemdReadyWatchdogStopping runs a service as systemd runs a unit of
// Type=notify with WatchdogSec: it pets the watchdog while it answers its
// health check, says READY=1 only once it is ready (not while a deferred
// readiness is pending), with its health already SERVING, and STOPPING=1
// on its way down.
func TestSystemdReadyWatchdogStopping(t *testing.T) {
	n := listenNotify(t)
	t.Setenv("WATCHDOG_USEC", strconv.Itoa(int((200 * time.Millisecond).Microseconds())))
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))

	root := testutil.TempDir(t)
	cfg := Config{Binary: "test", RootDir: root, APISocket: layout.APISocket(root, "test"), LogLevel: "info", LogFormat: "text"}
	readyc := make(chan func(), 1)
	svc := Service{Binary: "test", Setup: func(_ context.Context, rt *Runtime) error {
		readyc <- rt.DeferReady()
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, svc, cfg, slog.New(slog.DiscardHandler)) }()
	ready := <-readyc

	testutil.Eventually(t, "two watchdog pets while readiness is deferred", func() error {
		if c := n.count("WATCHDOG=1"); c < 2 {
			return fmt.Errorf("%d pets: %q", c, n.messages())
		}
		return nil
	})
	n.sync(t)
	if c := n.count("READY=1"); c != 0 {
		t.Fatalf("READY=1 before the service said it was ready: %q", n.messages())
	}

	conn, err := rpcutil.DialPeer(cfg.APISocket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ready()
	testutil.Eventually(t, "READY=1 with the address served", func() error {
		for _, m := range n.messages() {
			if hasLine(m, "READY=1") {
				if !hasLine(m, "STATUS=serving on "+cfg.APISocket) {
					return fmt.Errorf("READY without the status naming %s: %q", cfg.APISocket, m)
				}
				return nil
			}
		}
		return fmt.Errorf("no READY=1 yet: %q", n.messages())
	})
	cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer ccancel()
	if resp, err := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health once READY=1 was sent: %v, %v; want SERVING", resp.GetStatus(), err)
	}
	ready() // said once: a second call sends nothing
	pets := n.count("WATCHDOG=1")
	testutil.Eventually(t, "the watchdog petted on once ready", func() error {
		if c := n.count("WATCHDOG=1"); c <= pets {
			return fmt.Errorf("%d pets, %d when ready", c, pets)
		}
		return nil
	})

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run after cancel: %v", err)
	}
	// STOPPING=1 was sent before Run returned; the reader may not have
	// taken it yet.
	n.sync(t)
	if c := n.count("STOPPING=1"); c != 1 {
		t.Fatalf("STOPPING=1 sent %d times on the way down: %q", c, n.messages())
	}
	if c := n.count("READY=1"); c != 1 {
		t.Fatalf("READY=1 sent %d times: %q", c, n.messages())
	}
	ready() // after the stop: not said
	n.sync(t)
	if c := n.count("READY=1"); c != 1 {
		t.Fatalf("READY=1 sent %d times, once after the stop: %q", c, n.messages())
	}
}

// TestWatchdogPetsOnlyWhileAlive: a liveness check that fails, or hangs
// past its share of the interval, is no pet; pets resume when it answers
// again.
func TestWatchdogPetsOnlyWhileAlive(t *testing.T) {
	n := listenNotify(t)
	var state atomic.Int32 // 0 fails, 1 hangs, 2 answers
	var failedChecks atomic.Int32
	alive := func(ctx context.Context) error {
		switch state.Load() {
		case 0:
			failedChecks.Add(1)
			return errors.New("not serving")
		case 1:
			<-ctx.Done() // a wedged server: the check runs out of time
			failedChecks.Add(1)
			return ctx.Err()
		}
		return nil
	}
	s := newSupervisor(slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.watchdog(ctx, 40*time.Millisecond, alive) }()
	defer func() { cancel(); <-done }()

	waitChecks := func(what string, k int32) {
		t.Helper()
		from := failedChecks.Load()
		testutil.Eventually(t, what, func() error {
			if c := failedChecks.Load() - from; c < k {
				return fmt.Errorf("%d failed checks", c)
			}
			return nil
		})
	}
	waitChecks("three failed checks", 3)
	state.Store(1)
	waitChecks("two checks timed out", 2)
	n.sync(t)
	if c := n.count("WATCHDOG=1"); c != 0 {
		t.Fatalf("the watchdog was petted %d times while the service failed its check: %q", c, n.messages())
	}
	state.Store(2)
	testutil.Eventually(t, "pets once the check answers", func() error {
		if c := n.count("WATCHDOG=1"); c < 2 {
			return fmt.Errorf("%d pets", c)
		}
		return nil
	})
}
