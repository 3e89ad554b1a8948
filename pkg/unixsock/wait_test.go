package unixsock

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// waitDeadline bounds each wait of these tests; none should come near it.
const waitDeadline = 10 * time.Second

// TestWaitResolveLateSocket: WaitResolve waits for a socket, or a symlink
// to one, created inside the allowed directories after the wait began, and
// returns the path that resolves to it; one that appears outside them, or
// through a symlink leading out, is refused once it appears.
func TestWaitResolveLateSocket(t *testing.T) {
	dir, outside := tempDir(t), tempDir(t)
	c, err := NewConfiner([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		path    string
		create  func(t *testing.T, path string) string // the socket dialled
		wantErr error
	}{
		{"socket", filepath.Join(dir, "late.sock"), func(t *testing.T, p string) string { return listen(t, p) }, nil},
		{"symlink to a socket inside", filepath.Join(dir, "late-link"), func(t *testing.T, p string) string {
			s := listen(t, filepath.Join(dir, "target.sock"))
			symlink(t, s, p)
			return s
		}, nil},
		{"symlink leading out", filepath.Join(dir, "escape-link"), func(t *testing.T, p string) string {
			symlink(t, listen(t, filepath.Join(outside, "out.sock")), p)
			return ""
		}, errdefs.ErrInvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), waitDeadline)
			defer cancel()
			waiting := make(chan struct{})
			var once sync.Once
			mayAppear := func(p string) bool {
				ok := c.MayAppear(p)
				if ok {
					once.Do(func() { close(waiting) })
				}
				return ok
			}
			type result struct {
				path string
				err  error
			}
			done := make(chan result, 1)
			go func() {
				p, err := c.WaitResolve(ctx, tc.path, mayAppear)
				done <- result{p, err}
			}()
			select {
			case <-waiting:
			case r := <-done:
				t.Fatalf("WaitResolve returned before the endpoint existed: %q, %v", r.path, r.err)
			}
			want := tc.create(t, tc.path)
			r := <-done
			if tc.wantErr != nil {
				if !errors.Is(r.err, tc.wantErr) {
					t.Fatalf("WaitResolve: %q, %v; want an error wrapping %v", r.path, r.err, tc.wantErr)
				}
				return
			}
			if r.err != nil {
				t.Fatal(r.err)
			}
			if wantResolved, _ := filepath.EvalSymlinks(want); r.path != wantResolved {
				t.Fatalf("WaitResolve = %q, want %q", r.path, wantResolved)
			}
			conn, err := net.Dial("unix", r.path)
			if err != nil {
				t.Fatalf("dial the resolved path: %v", err)
			}
			_ = conn.Close()
		})
	}
}

// TestWaitResolveGivesUp: a wait ends with ctx, with an error wrapping
// ctx's and errdefs.ErrUnavailable; an endpoint that cannot appear inside
// the allowed directories is refused at once, and one that exists is
// resolved at once.
func TestWaitResolveGivesUp(t *testing.T) {
	dir, outside := tempDir(t), tempDir(t)
	c, err := NewConfiner([]string{dir})
	if err != nil {
		t.Fatal(err)
	}
	there := listen(t, filepath.Join(dir, "there.sock"))
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancelExpired := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancelExpired()
	<-expired.Done()
	// The cases refused at once must not wait: should one wait, it ends
	// here rather than hang.
	bounded, cancelBounded := context.WithTimeout(context.Background(), waitDeadline)
	defer cancelBounded()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		path string
		want []error // nil: resolved
	}{
		{"cancelled", cancelled, filepath.Join(dir, "never.sock"), []error{context.Canceled, errdefs.ErrUnavailable}},
		{"deadline", expired, filepath.Join(dir, "never.sock"), []error{context.DeadlineExceeded, errdefs.ErrUnavailable}},
		{"outside", bounded, filepath.Join(outside, "never.sock"), []error{errdefs.ErrInvalidArgument}},
		{"relative", bounded, "never.sock", []error{errdefs.ErrInvalidArgument}},
		{"dot-dot", bounded, dir + "/../" + filepath.Base(dir) + "/never.sock", []error{errdefs.ErrInvalidArgument}},
		{"there", cancelled, there, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := c.WaitResolve(tc.ctx, tc.path, nil)
			if tc.want == nil {
				if want, _ := filepath.EvalSymlinks(there); err != nil || p != want {
					t.Fatalf("WaitResolve = %q, %v; want %q", p, err, want)
				}
				return
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Fatalf("WaitResolve = %q, %v; want an error wrapping %v", p, err, w)
				}
			}
		})
	}
}

// listen serves a Unix socket at path until the test ends and returns path.
func listen(t *testing.T, path string) string {
	t.Helper()
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return path
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}
