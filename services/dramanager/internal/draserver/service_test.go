package draserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourcev1 "k8s.io/api/resource/v1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimview"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/draserver"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubecache"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/slicewatch"
)

// env is DRAService on a real Unix socket over a registry and the real
// node-local resource API.
type env struct {
	api    *dratest.API
	reg    *drivers.Registry
	client dmv1.DRAServiceClient
	sock   string // the service's socket
}

func start(t *testing.T, delay time.Duration) *env {
	t.Helper()
	return startWith(t, delay, nil)
}

// startWith is start with the claims manager that records returns, called
// with the registry and the API before the service is built (nil: none),
// and the view's options.
func startWith(t *testing.T, delay time.Duration, records func(*drivers.Registry, *dratest.API) claimview.Records, opts ...claimview.Option) *env {
	t.Helper()
	root := testutil.TempDir(t)
	api := dratest.StartAPI(t, root)
	reg, err := drivers.New(drivers.Config{Client: api.Client, NodeName: dratest.Node, AllowedDirs: []string{root}, DisconnectDelay: delay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(reg.Close)
	log := slog.New(slog.DiscardHandler)
	kc, err := kubecache.New(api.Client, dratest.Node)
	if err != nil {
		t.Fatal(err)
	}
	sl := slicewatch.New(kc.NodeSlices, api.Client, dratest.Node, stream.Limits{}, log)
	ctx, cancel := context.WithCancel(context.Background())
	var ran sync.WaitGroup
	ran.Go(func() { _ = sl.Run(ctx) })
	ran.Go(func() { _ = kc.Run(ctx) })
	t.Cleanup(func() { cancel(); ran.Wait() })

	path := filepath.Join(root, "dm.sock")
	lis, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := rpcutil.NewServer(log)
	var rec claimview.Records
	if records != nil {
		rec = records(reg, api)
	}
	view := claimview.New(api.Client, dratest.Node, rec, reg, opts...)
	dmv1.RegisterDRAServiceServer(srv, draserver.NewService("dm-1", reg, sl, draserver.WithClaims(view)))
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })
	conn, err := rpcutil.DialPeer(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &env{api: api, reg: reg, client: dmv1.NewDRAServiceClient(conn), sock: path}
}

func (e *env) register(t *testing.T, d *dratest.Driver) *dmv1.RegisterDRADriverResponse {
	t.Helper()
	resp, err := e.client.RegisterDRADriver(context.Background(), &dmv1.RegisterDRADriverRequest{
		DriverName: d.Name, Endpoint: d.Endpoint, Services: d.Services, SocketPath: d.RegSocket, Generation: d.Generation(t),
	})
	if err != nil {
		t.Fatalf("RegisterDRADriver %s: %v", d.Name, err)
	}
	return resp
}

func TestDriversAndSlicesOverGRPC(t *testing.T) {
	e := start(t, time.Hour)
	d := dratest.StartDriver(t, e.api, "gpu.example.com", "")
	resp := e.register(t, d)
	if resp.GetInstanceId() != "dm-1" || resp.GetInstance().GetService() != "v1.DRAPlugin" {
		t.Fatalf("register answer %v", resp)
	}
	testutil.Eventually(t, "the driver listed as connected and serving", func() error {
		l, err := e.client.ListDRADrivers(context.Background(), &dmv1.ListDRADriversRequest{})
		if err != nil {
			return err
		}
		if len(l.GetDrivers()) != 1 || len(l.GetDrivers()[0].GetInstances()) != 1 {
			return fmt.Errorf("drivers %v", l.GetDrivers())
		}
		in := l.GetDrivers()[0].GetInstances()[0]
		if !in.GetConnected() || !in.GetServing() || in.GetConnectionState() != "READY" || in.GetEndpoint() != d.Endpoint || !in.GetHealthService() {
			return fmt.Errorf("instance %v", in)
		}
		return nil
	})

	d.Publish(t, 2)
	var slices []*dmv1.ResourceSlice
	testutil.Eventually(t, "the driver's slice listed", func() error {
		l, err := e.client.ListResourceSlices(context.Background(), &dmv1.ListResourceSlicesRequest{DriverName: d.Name})
		if err != nil {
			return err
		}
		if slices = l.GetSlices(); len(slices) != 1 || len(slices[0].GetDevices()) != 2 {
			return fmt.Errorf("slices %v", slices)
		}
		return nil
	})
	s := slices[0]
	if s.GetDriver() != d.Name || s.GetNodeName() != dratest.Node || s.GetPool().GetName() != dratest.Node || s.GetPool().GetResourceSliceCount() != 1 || s.GetResourceVersion() == "" {
		t.Errorf("slice %v", s)
	}
	dev := s.GetDevices()[1]
	if dev.GetName() != "dev-1" || dev.GetAttributes()["model"] != "m1" || dev.GetAttributes()["index"] != "1" || dev.GetCapacity()["memory"] != "16Gi" {
		t.Errorf("device %v", dev)
	}
	var obj resourcev1.ResourceSlice
	if err := json.Unmarshal([]byte(s.GetJson()), &obj); err != nil || obj.Kind != "ResourceSlice" || obj.Name != s.GetName() || len(obj.Spec.Devices) != 2 {
		t.Errorf("json %q: %v", s.GetJson(), err)
	}
	if l, err := e.client.ListResourceSlices(context.Background(), &dmv1.ListResourceSlicesRequest{DriverName: "other.example.com"}); err != nil || len(l.GetSlices()) != 0 {
		t.Errorf("slices of another driver: %v, %v", l.GetSlices(), err)
	}
}

// recv reads one item, failing the test on error.
func recv(t *testing.T, ws grpc.ServerStreamingClient[dmv1.WatchResourceSlicesResponse]) *dmv1.WatchResourceSlicesResponse {
	t.Helper()
	m, err := ws.Recv()
	if err != nil {
		t.Fatalf("WatchResourceSlices: %v", err)
	}
	return m
}

func TestWatchResourceSlices(t *testing.T) {
	e := start(t, time.Second)
	d := dratest.StartDriver(t, e.api, "gpu.example.com", "")
	other := dratest.StartDriver(t, e.api, "nic.example.com", "")
	for _, dd := range []*dratest.Driver{d, other} {
		e.register(t, dd)
		testutil.Eventually(t, dd.Name+" connected", func() error {
			l, err := e.client.ListDRADrivers(context.Background(), &dmv1.ListDRADriversRequest{DriverName: dd.Name})
			if err != nil {
				return err
			}
			if len(l.GetDrivers()) != 1 || len(l.GetDrivers()[0].GetInstances()) != 1 || !l.GetDrivers()[0].GetInstances()[0].GetConnected() {
				return fmt.Errorf("drivers %v", l.GetDrivers())
			}
			return nil
		})
	}
	d.Publish(t, 1)
	other.Publish(t, 1)
	dratest.WaitSlices(t, e.api.Client, d.Name, 1, 1)
	dratest.WaitSlices(t, e.api.Client, other.Name, 1, 1)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ws, err := e.client.WatchResourceSlices(ctx, &dmv1.WatchResourceSlicesRequest{DriverName: d.Name})
	if err != nil {
		t.Fatal(err)
	}
	snap := recv(t, ws)
	if c := snap.GetChange(); c.GetType() != dmv1.ResourceSliceChangeType_RESOURCE_SLICE_CHANGE_TYPE_UPDATED || c.GetSlice().GetDriver() != d.Name || len(c.GetSlice().GetDevices()) != 1 {
		t.Fatalf("snapshot item %v", snap)
	}
	if m := recv(t, ws); m.GetSynced() == nil || m.GetInstanceId() != "dm-1" {
		t.Fatalf("after the snapshot: %v, want the synced marker", m)
	}
	// A change to the driver's devices updates its slice; the other
	// driver's changes are filtered out.
	other.Publish(t, 3)
	d.Publish(t, 2)
	for {
		c := recv(t, ws).GetChange()
		if c.GetSlice().GetDriver() != d.Name {
			t.Fatalf("change of another driver's slice %v", c)
		}
		if len(c.GetSlice().GetDevices()) == 2 {
			break
		}
	}
	// The driver stops: past the delay its slice is deleted, and the
	// stream says so.
	d.Helper.Stop()
	for {
		c := recv(t, ws).GetChange()
		if c.GetType() == dmv1.ResourceSliceChangeType_RESOURCE_SLICE_CHANGE_TYPE_REMOVED {
			if c.GetSlice().GetDriver() != d.Name {
				t.Fatalf("removal %v", c)
			}
			break
		}
	}
	cancel()
	if _, err := ws.Recv(); status.Code(err) != codes.Canceled && !errors.Is(err, io.EOF) {
		t.Errorf("after cancel: %v", err)
	}
}

func TestRegisterErrorsOverGRPC(t *testing.T) {
	e := start(t, time.Hour)
	for name, req := range map[string]*dmv1.RegisterDRADriverRequest{
		"no services": {DriverName: "gpu.example.com", Endpoint: "/x/dra.sock", Generation: "g"},
		"bad quoting": {DriverName: "gpu.example.com", Endpoint: `"/x`, Services: []string{"v1.DRAPlugin"}, Generation: "g"},
	} {
		if _, err := e.client.RegisterDRADriver(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s: %v, want InvalidArgument", name, err)
		}
	}
	if _, err := e.client.DeregisterDRADriver(context.Background(), &dmv1.DeregisterDRADriverRequest{DriverName: "gpu.example.com", Endpoint: "/x/dra.sock"}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("deregister without a generation: %v, want InvalidArgument", err)
	}
}

// A driver whose socket path is not UTF-8 (the upstream drav1 service on a
// socket of such a name: a GetInfo answer cannot carry one, so the
// registration socket's path is the endpoint) registers under its real
// path (endpoint_bytes) and is listed with it.
func TestOddEndpointPath(t *testing.T) {
	e := start(t, time.Hour)
	dir := filepath.Join(e.api.Root, "plugins_registry")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "gpu\xff\"#?%41.sock")
	lis, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	drav1.RegisterDRAPluginServer(srv, drav1.UnimplementedDRAPluginServer{})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	gen := testutil.Generation(t, path)
	_, err = e.client.RegisterDRADriver(context.Background(), &dmv1.RegisterDRADriverRequest{
		DriverName: "gpu.example.com", Endpoint: bounds.PathText(path), EndpointBytes: bounds.PathBytes(path), Services: []string{"v1.DRAPlugin"},
		SocketPath: bounds.PathText(path), SocketPathBytes: bounds.PathBytes(path), Generation: gen,
	})
	if err != nil {
		t.Fatalf("register the driver at %q: %v", path, err)
	}
	testutil.Eventually(t, "the odd endpoint listed, connected", func() error {
		l, err := e.client.ListDRADrivers(context.Background(), &dmv1.ListDRADriversRequest{DriverName: "gpu.example.com"})
		if err != nil {
			return err
		}
		if len(l.GetDrivers()) != 1 || len(l.GetDrivers()[0].GetInstances()) != 1 {
			return fmt.Errorf("drivers %v", l.GetDrivers())
		}
		in := l.GetDrivers()[0].GetInstances()[0]
		if p, err := bounds.PathFromWire(in.GetEndpoint(), in.GetEndpointBytes()); err != nil || p != path || !in.GetConnected() {
			return fmt.Errorf("instance %v (path %q, %v)", in, p, err)
		}
		return nil
	})
	removed, err := e.client.DeregisterDRADriver(context.Background(), &dmv1.DeregisterDRADriverRequest{
		DriverName: "gpu.example.com", EndpointBytes: bounds.PathBytes(path), Generation: gen,
	})
	if err != nil || !removed.GetRemoved() {
		t.Fatalf("deregister: %v, %v", removed, err)
	}
}
