// Package testutil holds the helpers that tests in several packages share:
// waiting for a state with a deadline, socket generations, temporary
// directories short enough for Unix socket paths, stale sockets, and
// looking up a metric among gathered families.
//
// Tests wait for states, never for time: the deadlines here are generous so
// that a busy two-core machine running the race detector passes, and a
// broken feature still fails (it only takes longer to say so).
package testutil

import (
	"os"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Deadline bounds every wait in this package.
const Deadline = 60 * time.Second

// poll is how often a condition is checked again.
const poll = 5 * time.Millisecond

// WaitFor polls cond until it holds, failing the test when Deadline passes.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Deadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", Deadline, what)
		}
		time.Sleep(poll)
	}
}

// Eventually polls cond until it returns nil, failing the test with cond's
// last error when Deadline passes.
func Eventually(t testing.TB, what string, cond func() error) {
	t.Helper()
	EventuallyWithin(t, Deadline, what, cond)
}

// EventuallyWithin is Eventually with its own deadline, for a wait that
// follows something slower than Deadline allows for (a client backing off
// while its server restarts).
func EventuallyWithin(t testing.TB, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(poll)
	}
}

// Generation returns the watcher's generation of the socket at path.
func Generation(t testing.TB, path string) string {
	t.Helper()
	id, _, err := unixsock.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return id.Generation()
}

// TempDir returns a new directory under the system temp dir, removed when
// the test ends. Unlike t.TempDir its path is short, so sockets beneath it
// stay within the 107-byte limit of a Unix socket address.
func TempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "np")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// StaleSocket leaves a socket file at path that refuses connections: it was
// listened on, then closed without being removed, as a plugin killed
// without cleanup leaves it (stack.StaleSocket). It fails the test with
// t.Fatal, so it must be called from the test's goroutine; elsewhere call
// stack.StaleSocket and report its error.
func StaleSocket(t testing.TB, path string) {
	t.Helper()
	if err := stack.StaleSocket(path, true); err != nil {
		t.Fatalf("stale socket %s: %v", path, err)
	}
}
