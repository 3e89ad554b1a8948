package rpcutil_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// serveHealth serves gRPC health on a Unix socket at path, answering
// SERVING for the service name given.
func serveHealth(t *testing.T, path, name string) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	h := health.NewServer()
	h.SetServingStatus(name, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(s, h)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
}

// TestDialByRawPath proves that the path dialled is byte for byte the path
// given: URL syntax in a file name ('#', '?', '%xx', spaces) is not parsed.
// Each socket has a decoy beside it, at the path a URL parser would produce;
// only the real socket knows the service name asked for.
func TestDialByRawPath(t *testing.T) {
	dir := testutil.TempDir(t)
	for _, tc := range []struct{ name, decoy string }{
		{"lnk#x.sock", "lnk"},
		{"q?x=1.sock", "q"},
		{"d%41.sock", "dA.sock"},
		{"%2E%2E%2Fv.sock", "../v.sock"},
		{"with space.sock", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name)
			serveHealth(t, path, "real")
			if tc.decoy != "" && !strings.Contains(tc.decoy, "/") {
				serveHealth(t, filepath.Join(dir, tc.decoy), "decoy")
			}
			for _, dial := range []func(string, ...grpc.DialOption) (*grpc.ClientConn, error){rpcutil.DialPlugin, rpcutil.DialPeer} {
				conn, err := dial(path)
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "real"})
				cancel()
				_ = conn.Close()
				if err != nil {
					t.Fatalf("health of %q: %v", path, err)
				}
				if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("health of %q: %v", path, resp.GetStatus())
				}
			}
		})
	}
}

// TestDialLongestPath dials a socket whose path is 107 bytes, the longest a
// Unix socket address holds.
func TestDialLongestPath(t *testing.T) {
	dir := testutil.TempDir(t)
	name := strings.Repeat("x", 107-len(dir)-1)
	path := filepath.Join(dir, name)
	if len(path) != 107 {
		t.Fatalf("path is %d bytes", len(path))
	}
	serveHealth(t, path, "real")
	conn, err := rpcutil.DialPlugin(path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: "real"}); err != nil {
		t.Fatal(err)
	}
}

func TestDialPluginNeedsAbsolutePath(t *testing.T) {
	if _, err := rpcutil.DialPlugin("relative.sock"); err == nil {
		t.Fatal("a relative plugin path was accepted")
	}
}

// FuzzConfinedDialTarget runs the whole chain a plugin's path goes
// through: confinement (unixsock.Confiner.Resolve), then DialPlugin of
// the path it resolved to. Every socket serves health under its own path
// only, so a call answered SERVING for the resolved path proves the
// socket dialled is byte for byte the one checked, and Resolve proves it
// is inside. The sockets are named as a URL parser would cut or decode
// them, beside the sockets it would reach instead, and a symlink "lnk"
// leads to a socket outside.
func FuzzConfinedDialTarget(f *testing.F) {
	dir, err := os.MkdirTemp("", "npdt")
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = os.RemoveAll(dir) })
	allowed := filepath.Join(dir, "allowed")
	outside := filepath.Join(dir, "outside")
	for _, d := range []string{allowed, outside} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			f.Fatal(err)
		}
	}
	var servers []*grpc.Server
	f.Cleanup(func() {
		for _, s := range servers {
			s.Stop()
		}
	})
	serve := func(path string) {
		lis, err := net.Listen("unix", path)
		if err != nil {
			f.Fatal(err)
		}
		s := grpc.NewServer()
		h := health.NewServer()
		h.SetServingStatus(path, healthpb.HealthCheckResponse_SERVING)
		healthpb.RegisterHealthServer(s, h)
		go func() { _ = s.Serve(lis) }()
		servers = append(servers, s)
	}
	for _, name := range []string{"in.sock", "lnk#x", "q?x=1.sock", "q", "d%41.sock", "dA.sock", "sp ace.sock", "%2E%2E%2Foutside%2Fvictim.sock"} {
		serve(filepath.Join(allowed, name))
	}
	serve(filepath.Join(outside, "victim.sock"))
	if err := os.Symlink(filepath.Join(outside, "victim.sock"), filepath.Join(allowed, "lnk")); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink("in.sock", filepath.Join(allowed, "in-link")); err != nil {
		f.Fatal(err)
	}
	c, err := unixsock.NewConfiner([]string{allowed})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		"in.sock", "in-link", "lnk", "lnk#x", "lnk?x", "q?x=1.sock", "d%41.sock", "%64A.sock", "sp ace.sock", "sp%20ace.sock",
		"%2E%2E%2Foutside%2Fvictim.sock", "..%2Foutside%2Fvictim.sock", "../outside/victim.sock", "./in.sock", "", "a\x00b",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rel string) {
		p := allowed + "/" + rel
		resolved, err := c.Resolve(p)
		if err != nil {
			return
		}
		if !c.Within(resolved) {
			t.Fatalf("Resolve(%q) = %q, outside %s", p, resolved, allowed)
		}
		if !unixsock.IsSocket(resolved) {
			return // the directory itself, say: nothing to dial
		}
		conn, err := rpcutil.DialPlugin(resolved)
		if err != nil {
			t.Fatalf("DialPlugin(%q): %v", resolved, err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: resolved})
		if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%q resolved to %q, but the socket dialled does not serve that path: %v, %v", p, resolved, resp, err)
		}
	})
}
