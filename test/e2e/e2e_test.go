// Package e2e tests nodeplug as its users run it: the real service binaries
// as separate processes, real plugins on real Unix sockets, traces exported
// over OTLP to a receiver in the test process.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

var binDir string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		if os.Getenv(accessCallerEnv) != "" {
			return m.Run() // a caller process of TestLocalUsers: no stack to build
		}
		dir, err := os.MkdirTemp("", "npbin")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := stack.Build(ctx, dir, "nodeplug-apiserver", "nodeplug-watcher", "nodeplug-reconciler",
			"nodeplug-devicemanager", "nodeplug-dramanager", "nodeplug-sampleplugin", "nodeplugctl", "nodeplug-console"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		// Readable by other users too: one test runs the stack as nobody.
		if err := os.Chmod(dir, 0o755); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		binDir = dir
		return m.Run()
	}())
}

// env is one running stack with its clients.
type env struct {
	t    *testing.T
	root string
	st   *stack.Processes
	dm   dmv1.DeviceManagerServiceClient
	rc   rcv1.ReconcilerServiceClient
}

func newEnv(t *testing.T, extraEnv ...string) *env {
	t.Helper()
	root := testutil.TempDir(t)
	st := stack.NewProcesses(binDir, root, extraEnv...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		st.StopAll()
		if t.Failed() {
			for _, s := range stack.Services {
				if p := st.Process(s); p != nil {
					t.Logf("%s log:\n%s", s, p.Logs())
				}
			}
		}
	})
	if err := st.StartAll(ctx); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, root: root, st: st}
	dmConn, err := rpcutil.DialPeer(st.Addr("devicemanager"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dmConn.Close() })
	rcConn, err := rpcutil.DialPeer(st.Addr("reconciler"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rcConn.Close() })
	e.dm = dmv1.NewDeviceManagerServiceClient(dmConn)
	e.rc = rcv1.NewReconcilerServiceClient(rcConn)
	e.waitLive()
	return e
}

// waitLive waits until the reconciler reports SERVING, which it does once
// it follows the watcher's live events: sockets created from then on are
// live events (sockets created before reach it in the watcher's snapshot,
// which starts their traces in the reconciler, as DESIGN.md's contracts
// say).
func (e *env) waitLive() {
	e.t.Helper()
	conn, err := rpcutil.DialPeer(e.st.Addr("reconciler"))
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	testutil.Eventually(e.t, "the reconciler is healthy", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("status %v", resp.GetStatus())
		}
		return nil
	})
}

// plugin starts a device plugin. In plugins_registry mode its socket is in
// plugins_registry; in legacy mode it is in device-plugins and the plugin
// calls Register on kubelet.sock.
func (e *env) plugin(name, resource string, devices int, legacy bool) *sampleplugin.Plugin {
	e.t.Helper()
	dir := layout.PluginsRegistryDir(e.root)
	if legacy {
		dir = layout.DevicePluginsDir(e.root)
	}
	p := plugintest.Start(e.t, sampleplugin.Options{Resource: resource, SocketPath: filepath.Join(dir, name+".sock"), Devices: devices})
	if legacy {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.Register(ctx, layout.KubeletSocket(e.root)); err != nil {
			e.t.Fatalf("legacy Register: %v", err)
		}
	}
	return p
}

// resource returns the named resource from ListResources, or nil.
func (e *env) resource(name string) *dmv1.Resource {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.dm.ListResources(ctx, &dmv1.ListResourcesRequest{})
	if err != nil {
		return nil
	}
	for _, r := range resp.GetResources() {
		if r.GetName() == name {
			return r
		}
	}
	return nil
}

func (e *env) waitAllocatable(name string, n int64) {
	e.t.Helper()
	testutil.Eventually(e.t, "resource "+name+" allocatable", func() error {
		r := e.resource(name)
		if r == nil {
			return fmt.Errorf("resource %s absent", name)
		}
		if r.GetAllocatable() != n {
			return fmt.Errorf("allocatable %d, want %d", r.GetAllocatable(), n)
		}
		return nil
	})
}

// pluginBySocket returns the reconciler's view of one socket.
func (e *env) pluginBySocket(path string) *rcv1.Plugin {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.rc.ListPlugins(ctx, &rcv1.ListPluginsRequest{})
	if err != nil {
		return nil
	}
	for _, p := range resp.GetPlugins() {
		if p.GetSocketPath() == path {
			return p
		}
	}
	return nil
}
