package rpcutil_test

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
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
