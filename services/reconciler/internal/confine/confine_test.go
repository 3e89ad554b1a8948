package confine

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Check accepts an endpoint that exists inside the allowed directories, or
// that does not exist yet and could appear only inside them; Resolve, at
// dial time, accepts only the first and returns the path to dial.
func TestCheckAndResolve(t *testing.T) {
	root := testutil.TempDir(t)
	outside := testutil.TempDir(t)
	conf, err := unixsock.NewConfiner([]string{root})
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(root, "real", "p.sock")
	if err := os.MkdirAll(filepath.Dir(sock), 0o750); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	for _, link := range [][2]string{
		{filepath.Join(root, "real"), filepath.Join(root, "in")},
		{outside, filepath.Join(root, "out")},
		{filepath.Join(outside, "x.sock"), filepath.Join(root, "out.sock")},
	} {
		if err := os.Symlink(link[0], link[1]); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name     string
		endpoint string
		check    bool   // Check accepts it
		dial     string // what Resolve returns ("": refused)
	}{
		{"socket inside", sock, true, sock},
		{"through a symlinked directory inside", filepath.Join(root, "in", "p.sock"), true, sock},
		{"missing, inside", filepath.Join(root, "later", "p.sock"), true, ""},
		{"missing, below a symlinked directory leading out", filepath.Join(root, "out", "p.sock"), false, ""},
		{"missing, deeper below it", filepath.Join(root, "out", "a", "b", "p.sock"), false, ""},
		{"dangling symlink leading out", filepath.Join(root, "out.sock"), false, ""},
		{"outside", filepath.Join(outside, "p.sock"), false, ""},
		{"with ..", filepath.Join(root, "real") + "/../real/p.sock", false, ""},
		{"relative", "real/p.sock", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := Check(conf, tc.endpoint); (err == nil) != tc.check {
				t.Fatalf("Check = %v, want accepted %v", err, tc.check)
			} else if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("Check = %v, not an invalid argument", err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // a missing endpoint is not waited for
			dial, err := Resolve(ctx, conf, tc.endpoint)
			if dial != tc.dial || (err == nil) != (tc.dial != "") {
				t.Fatalf("Resolve = %q, %v; want %q", dial, err, tc.dial)
			}
		})
	}
	if err := Check(nil, "relative"); err != nil {
		t.Fatalf("Check without a confiner = %v", err)
	}
	if dial, err := Resolve(context.Background(), nil, "/any/p.sock"); err != nil || dial != "/any/p.sock" {
		t.Fatalf("Resolve without a confiner = %q, %v", dial, err)
	}
}
