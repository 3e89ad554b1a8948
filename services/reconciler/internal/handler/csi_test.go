package handler

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/confine"
)

// csiServer is a CSI driver's Identity and Node services on a real Unix
// socket; it counts the calls it gets, all of them (calls) and
// GetPluginInfo's (infoCalls).
type csiServer struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	name      string
	calls     atomic.Int32
	infoCalls atomic.Int32
}

func (c *csiServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	c.calls.Add(1)
	c.infoCalls.Add(1)
	return &csi.GetPluginInfoResponse{Name: c.name}, nil
}

func (c *csiServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	c.calls.Add(1)
	return &csi.NodeGetInfoResponse{NodeId: "node-1"}, nil
}

// serveCSI serves a CSI driver named name at path until the test ends.
func serveCSI(t *testing.T, path, name string) *csiServer {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c := &csiServer{name: name}
	s := grpc.NewServer()
	csi.RegisterIdentityServer(s, c)
	csi.RegisterNodeServer(s, c)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return c
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

// The CSI handler confines the endpoint again when it dials: an endpoint
// whose parent directory is (or has become, after it was validated) a
// symlink leading out is refused, and the driver outside gets no call; one
// whose symlinks stay inside is dialled at the path it resolves to.
func TestCSIConfinesTheEndpointWhenItDials(t *testing.T) {
	root := testutil.TempDir(t)
	outside := testutil.TempDir(t)
	conf, err := unixsock.NewConfiner([]string{root})
	if err != nil {
		t.Fatal(err)
	}
	escape := serveCSI(t, filepath.Join(outside, "csi.sock"), "csi.example.com")

	t.Run("parent directory is a symlink leading out", func(t *testing.T) {
		symlink(t, outside, filepath.Join(root, "link"))
		endpoint := filepath.Join(root, "link", "csi.sock")
		h := NewCSI(NewDrivers(), conf)
		err := h.Register(context.Background(), cache.Plugin{Name: "csi.example.com", Endpoint: endpoint, SocketPath: "/r.sock", Versions: []string{"1.0.0"}})
		if err == nil || !strings.Contains(err.Error(), "outside the allowed directories") || !strings.Contains(err.Error(), endpoint) {
			t.Fatalf("Register = %v, want the endpoint refused as outside", err)
		}
	})

	t.Run("accepted before it existed, then a symlink leading out", func(t *testing.T) {
		endpoint := filepath.Join(root, "later", "csi.sock")
		// At validation the endpoint does not exist, and could only appear
		// inside the allowed directories.
		if err := confine.Check(conf, endpoint); err != nil {
			t.Fatalf("validation of an endpoint that may appear: %v", err)
		}
		// Then its parent appears as a symlink to the driver outside.
		symlink(t, outside, filepath.Join(root, "later"))
		h := NewCSI(NewDrivers(), conf)
		err := h.Register(context.Background(), cache.Plugin{Name: "csi.example.com", Endpoint: endpoint, SocketPath: "/r.sock", Versions: []string{"1.0.0"}})
		if err == nil || !strings.Contains(err.Error(), "outside the allowed directories") {
			t.Fatalf("Register = %v, want the endpoint refused as outside", err)
		}
		if err := confine.Check(conf, endpoint); err == nil {
			t.Fatal("validation accepts the endpoint now that its parent leads out")
		}
	})

	if n := escape.calls.Load(); n != 0 {
		t.Fatalf("the driver outside the allowed directories got %d calls", n)
	}

	t.Run("symlinks that stay inside", func(t *testing.T) {
		real := filepath.Join(root, "real")
		inside := serveCSI(t, filepath.Join(real, "csi.sock"), "csi-in.example.com")
		symlink(t, real, filepath.Join(root, "in-link"))
		drivers := NewDrivers()
		h := NewCSI(drivers, conf)
		endpoint := filepath.Join(root, "in-link", "csi.sock")
		if err := h.Register(context.Background(), cache.Plugin{Name: "csi-in.example.com", Endpoint: endpoint, SocketPath: "/r.sock", Versions: []string{"1.0.0"}}); err != nil {
			t.Fatalf("Register = %v", err)
		}
		if d := drivers.List(TypeCSIPlugin); len(d) != 1 || d[0].Endpoint != endpoint || d[0].CSI.NodeID != "node-1" || inside.calls.Load() != 1 {
			t.Fatalf("drivers %+v after %d calls", d, inside.calls.Load())
		}
	})

}

// As the kubelet, the CSI handler calls only NodeGetInfo: no
// GetPluginInfo, so a driver whose Identity names it otherwise (or that
// serves no Identity) registers. An endpoint that does not exist fails at
// once (UNAVAILABLE, for the reconciler's backoff), however long the
// handler's timeout, and one that appears later registers on the retry.
func TestCSICallsOnlyNodeGetInfo(t *testing.T) {
	root := testutil.TempDir(t)
	conf, err := unixsock.NewConfiner([]string{root})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := filepath.Join(root, "csi", "csi.sock")
	drivers := NewDrivers()
	h := NewCSI(drivers, conf)
	// A wait for the endpoint would outlast the test's deadline.
	h.Timeout = time.Hour
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	p := cache.Plugin{Name: "csi.example.com", Endpoint: endpoint, SocketPath: "/r.sock", Versions: []string{"1.0.0"}}
	err = h.Register(ctx, p)
	if err == nil || !strings.Contains(err.Error(), "does not exist") || errdefs.Code(err) != errdefs.Code(errdefs.ErrUnavailable) {
		t.Fatalf("Register of a missing endpoint = %v, want UNAVAILABLE at once", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Register of a missing endpoint waited")
	}
	srv := serveCSI(t, endpoint, "another-name.example.com")
	if err := h.Register(ctx, p); err != nil {
		t.Fatalf("Register once the endpoint exists = %v", err)
	}
	if n, info := srv.calls.Load(), srv.infoCalls.Load(); n != 1 || info != 0 {
		t.Fatalf("%d calls, %d of them GetPluginInfo; want NodeGetInfo only", n, info)
	}
	if d := drivers.List(TypeCSIPlugin); len(d) != 1 || d[0].CSI.NodeID != "node-1" {
		t.Fatalf("drivers %+v", d)
	}
}

// The CSI handler dials a GetInfo endpoint by its bytes: an endpoint named
// as a URL parser would decode ("%2E%2E%2F…" to "../…") or cut ("lnk#x"
// to "lnk", a symlink to a driver outside) reaches the socket of exactly
// that name inside the allowed directory, and the driver outside gets no
// call; the symlink itself is refused.
func TestCSIDialsTheEndpointByItsBytes(t *testing.T) {
	root := testutil.TempDir(t)
	outside := testutil.TempDir(t)
	conf, err := unixsock.NewConfiner([]string{root})
	if err != nil {
		t.Fatal(err)
	}
	victim := serveCSI(t, filepath.Join(outside, "csi.sock"), "csi.example.com")
	symlink(t, filepath.Join(outside, "csi.sock"), filepath.Join(root, "lnk"))
	rel, err := filepath.Rel(root, filepath.Join(outside, "csi.sock"))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{
		strings.NewReplacer(".", "%2E", "/", "%2F").Replace(rel),
		strings.ReplaceAll(rel, "/", "%2F"),
		"lnk#x", "lnk?x", "%6Cnk",
	} {
		t.Run(name, func(t *testing.T) {
			endpoint := root + "/" + name
			inside := serveCSI(t, endpoint, "csi.example.com")
			drivers := NewDrivers()
			h := NewCSI(drivers, conf)
			if err := h.Register(context.Background(), cache.Plugin{Name: "csi.example.com", Endpoint: endpoint, SocketPath: "/r.sock", Versions: []string{"1.0.0"}}); err != nil {
				t.Fatalf("Register = %v", err)
			}
			if n := inside.calls.Load(); n != 1 {
				t.Fatalf("the socket named %q got %d calls, want 1 (NodeGetInfo)", name, n)
			}
			if d := drivers.List(TypeCSIPlugin); len(d) != 1 || d[0].Endpoint != endpoint {
				t.Fatalf("drivers %+v", d)
			}
		})
	}
	t.Run("the symlink leading out", func(t *testing.T) {
		h := NewCSI(NewDrivers(), conf)
		err := h.Register(context.Background(), cache.Plugin{Name: "csi.example.com", Endpoint: filepath.Join(root, "lnk"), SocketPath: "/r.sock", Versions: []string{"1.0.0"}})
		if err == nil || !strings.Contains(err.Error(), "outside the allowed directories") {
			t.Fatalf("Register = %v, want the endpoint refused as outside", err)
		}
	})
	if n := victim.calls.Load(); n != 0 {
		t.Fatalf("the driver outside the allowed directories got %d calls", n)
	}
}
