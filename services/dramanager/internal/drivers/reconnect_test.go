package drivers_test

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"

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
