package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// swapToOutside renames a symlink to target over path, as an attacker who
// may create files beside path does: one rename, so that path is never
// missing.
func swapToOutside(t *testing.T, target, path string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".swap")
	if err := os.Symlink(target, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestSwapAfterCheckNeverReachesOutside (issue 25, N1): the endpoint a
// registration names is a socket inside the root when it is checked and
// dialled; once the manager's connection has reached it, a symlink to a
// socket outside is renamed over it and that first connection breaks.
// gRPC dials again, and that dial must check again: the socket outside
// never receives a connection, the registration fails, and the log names
// the endpoint. It loops the swap, by both registration paths.
func TestSwapAfterCheckNeverReachesOutside(t *testing.T) {
	e := newEnv(t, time.Minute)
	victim := outsidePlugin(t, "example.com/victim")
	conn, err := rpcutil.DialPeer(e.kubeletSock())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	kc := pluginapi.NewRegistrationClient(conn)
	for round := range 8 {
		legacy := round%2 == 0
		dir := e.regDir
		if legacy {
			dir = e.dpDir
		}
		ep := filepath.Join(dir, fmt.Sprintf("swap-%d.sock", round))
		reached := acceptOnce(t, ep)
		res := fmt.Sprintf("example.com/swap-%d", round)
		done := make(chan error, 1)
		go func() {
			if legacy {
				_, err := kc.Register(ctxT(t), &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: filepath.Base(ep), ResourceName: res})
				done <- err
				return
			}
			_, err := e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
				ResourceName: res, Endpoint: ep, Versions: []string{pluginapi.Version}, SocketPath: ep, Generation: "g",
			})
			done <- err
		}()
		// The manager checked the endpoint and connected to it.
		var first net.Conn
		select {
		case first = <-reached:
		case err := <-done:
			t.Fatalf("round %d: the registration ended before it connected: %v", round, err)
		}
		swapToOutside(t, victim.SocketPath(), ep)
		_ = first.Close()
		if err := <-done; err == nil {
			t.Fatalf("round %d: the registration of %s succeeded after the swap", round, ep)
		}
		if r := e.resource(res); r != nil {
			t.Fatalf("round %d: %s registered: %v", round, res, r)
		}
		if !e.logs.has("device plugin registration failed", "endpoint", ep) {
			t.Errorf("round %d: no log names the endpoint %s", round, ep)
		}
	}
	untouched(t, victim)
}

// acceptOnce listens at path and hands over the first connection it
// accepts; it then stops listening, and never speaks gRPC.
func acceptOnce(t *testing.T, path string) <-chan net.Conn {
	t.Helper()
	l, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	ch := make(chan net.Conn, 1)
	go func() {
		defer l.Close()
		if c, err := l.Accept(); err == nil {
			ch <- c
		}
	}()
	return ch
}

// TestRedialAfterGoawayNeverReachesOutside (issue 25, N1): a live legacy
// plugin whose server ends every connection after a short age (gRPC's
// max connection age: a GOAWAY, its ListAndWatch stream kept) has a
// symlink to a socket outside renamed over its endpoint. The next call that
// needs a new connection fails (UNAVAILABLE) rather than run on the socket
// outside; so does the redial of the recorded endpoint when the manager
// restarts. The socket outside never receives a call.
func TestRedialAfterGoawayNeverReachesOutside(t *testing.T) {
	e := newEnv(t, time.Minute)
	victim := outsidePlugin(t, "example.com/victim")
	const res = "example.com/aged"
	ep := filepath.Join(e.dpDir, "aged.sock")
	inner := &gatedPlugin{devices: []*pluginapi.Device{{ID: "d0", Health: pluginapi.Healthy}, {ID: "d1", Health: pluginapi.Healthy}}}
	lis, err := unixsock.Listen(ep)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: 20 * time.Millisecond, MaxConnectionAgeGrace: time.Hour}))
	pluginapi.RegisterDevicePluginServer(srv, inner)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })

	conn, err := rpcutil.DialPeer(e.kubeletSock())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if _, err := pluginapi.NewRegistrationClient(conn).Register(ctxT(t), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(ep), ResourceName: res,
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(e.logs.String())
		}
	})
	e.waitCounts(res, 2, 2)
	allocate := func(i int) error {
		pod := fmt.Sprintf("pod-%d", i)
		_, err := e.client.Allocate(ctxT(t), allocReq(pod, "c", res, 1))
		if err == nil {
			_, err = e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: pod})
			if err != nil {
				t.Fatalf("Release %s: %v", pod, err)
			}
		}
		return err
	}
	if err := allocate(0); err != nil {
		t.Fatalf("Allocate before the swap: %v", err)
	}

	swapToOutside(t, victim.SocketPath(), ep)
	// Each connection is ended 20 ms after it was made: soon a call needs
	// a new one.
	i := 1
	testutil.Eventually(t, "an Allocate that needs a new connection", func() error {
		err := allocate(i)
		i++
		switch {
		case len(victim.Calls()) > 0:
			return nil // reported below
		case err == nil:
			return errors.New("answered over a connection made before the swap")
		case status.Code(err) != codes.Unavailable:
			t.Fatalf("Allocate after the swap: %v, want UNAVAILABLE", err)
		}
		return nil
	})
	untouched(t, victim)

	// The restarted manager redials the recorded endpoint: refused too.
	e.shutdown()
	e.start()
	testutil.WaitFor(t, "the recorded endpoint refused at the redial", func() bool {
		return e.logs.has("recorded endpoint not redialled", "endpoint", ep)
	})
	untouched(t, victim)
}
