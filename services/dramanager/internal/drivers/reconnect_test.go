package drivers_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
)

// countingListener counts the connections its server accepted.
type countingListener struct {
	net.Listener
	accepted atomic.Int32
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// A driver's server that ends each connection (a GOAWAY after a maximum
// age, as a server restarting in place on the same socket does) is
// connected to again each time, with no call to wake the channel: the
// instance is connected, and the driver's slices are not due for deletion.
func TestConnectionLostInPlaceIsConnectedAgain(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	r, _ := newRegistry(t, api, time.Hour)
	endpoint := filepath.Join(api.Root, "aging.sock")
	ln, err := net.Listen("unix", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	srv := grpc.NewServer(grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge: 200 * time.Millisecond, MaxConnectionAgeGrace: 50 * time.Millisecond,
	}))
	go func() { _ = srv.Serve(cl) }()
	t.Cleanup(srv.Stop)

	const driver = "aging.example.com"
	if _, err := r.Register(context.Background(), drivers.Registration{
		Driver: driver, Endpoint: endpoint, Services: []string{"v1.DRAPlugin"}, SocketPath: endpoint, Generation: "1",
	}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "three connections, the last one up", func() error {
		in, ok := instance(r, driver, endpoint)
		if n := cl.accepted.Load(); n < 3 || !ok || !in.Connected {
			return fmt.Errorf("%d connections accepted; instance %+v", n, in)
		}
		return nil
	})
	if dd := r.Drivers(driver); len(dd) != 1 || !dd[0].SliceDeletion.IsZero() {
		t.Errorf("drivers = %+v, want one, with no deletion pending", dd)
	}
}

// A driver whose socket accepts connections and never answers (a wedged
// driver: the kernel still accepts for it) is not connected: its slices
// on the node are deleted after the delay, as a gone driver's are, though
// every connection to it is made.
func TestSilentDriverIsNotConnected(t *testing.T) {
	dir := testutil.TempDir(t)
	const driver = "silent.example.com"
	client := fake.NewClientset(nodeSlice(driver))
	deleted := make(chan string, 10)
	client.PrependReactor("delete-collection", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		deleted <- a.(k8stesting.DeleteCollectionAction).GetListRestrictions().Fields.String()
		return true, nil, nil
	})
	r, err := drivers.New(drivers.Config{Client: client, NodeName: "node-1", AllowedDirs: []string{dir}, DisconnectDelay: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)

	endpoint := filepath.Join(dir, "silent.sock")
	ln, err := net.Listen("unix", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn // held open, never written to
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	accepted := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(conns)
	}
	if _, err := r.Register(context.Background(), drivers.Registration{
		Driver: driver, Endpoint: endpoint, Services: []string{"v1.DRAPlugin"}, SocketPath: endpoint, Generation: "1",
	}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the driver's socket connected to", func() bool { return accepted() > 0 })
	// The first connection stays open and unanswered for the dial's 10 s
	// (connectParams); the deletion is due 200 ms after the registration,
	// long before gRPC gives that connection up and makes another. Had
	// the made connection counted as connected, the deletion would wait
	// for it to fail, and each new connection would put it off again.
	select {
	case sel := <-deleted:
		if want := "spec.driver=" + driver + ",spec.nodeName=node-1"; sel != want {
			t.Errorf("deleted %q, want %q", sel, want)
		}
	case <-time.After(time.Minute):
		in, _ := instance(r, driver, endpoint)
		t.Fatalf("the silent driver's slices were not deleted; instance %+v", in)
	}
	if in, ok := instance(r, driver, endpoint); !ok || in.Connected {
		t.Errorf("instance %+v, want registered and not connected", in)
	}
	if n := accepted(); n != 1 {
		t.Errorf("%d connections made before the deletion, want the first one still waiting for an answer", n)
	}
}
