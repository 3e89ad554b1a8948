package access_test

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/access"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/stream"
)

const watchMethod = "/nodeplug.devicemanager.v1.DeviceManagerService/WatchResources"

// watchService answers WatchResources with a synced marker and holds the
// stream until the client goes: a Watch RPC whose streams stay open.
type watchService struct {
	dmv1.UnimplementedDeviceManagerServiceServer
}

func (watchService) WatchResources(_ *dmv1.WatchResourcesRequest, ss grpc.ServerStreamingServer[dmv1.WatchResourcesResponse]) error {
	if err := ss.Send(&dmv1.WatchResourcesResponse{Item: &dmv1.WatchResourcesResponse_Synced{Synced: &dmv1.Synced{}}}); err != nil {
		return err
	}
	<-ss.Context().Done()
	return ss.Context().Err()
}

func (watchService) ListResources(context.Context, *dmv1.ListResourcesRequest) (*dmv1.ListResourcesResponse, error) {
	return &dmv1.ListResourcesResponse{}, nil
}

// watchServer serves watchService over TCP with mutual TLS behind the
// Guard and the Watch bounds, its errors mapped as nodeplug's servers map
// them.
func watchServer(t *testing.T, dir string, serverCA, clientCA *ca, limits stream.SlotLimits) (string, *access.WatchBounds, *prometheus.Registry) {
	t.Helper()
	cert, key := serverCA.issue(t, dir, "server", nil, true, time.Now().Add(time.Hour))
	caFile := filepath.Join(dir, "client-ca.pem")
	write(t, caFile, clientCA.PEM)
	st, err := access.NewServerTLS(cert, key, caFile)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	wb := access.NewWatchBounds(limits, reg)
	mapErrors := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		return errdefs.ToGRPC(h(srv, ss))
	}
	g := access.NewGuard(slog.New(slog.DiscardHandler), reg)
	gs := grpc.NewServer(grpc.Creds(&access.Credentials{TLS: st}), grpc.ChainStreamInterceptor(mapErrors, g.Stream, wb.Stream))
	dmv1.RegisterDeviceManagerServiceServer(gs, watchService{})
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String(), wb, reg
}

// tcpClient is one client connection whose TCP connection the test can
// break without a goodbye.
type tcpClient struct {
	conn *grpc.ClientConn
	mu   sync.Mutex
	raw  []net.Conn
}

func newTCPClient(t *testing.T, addr string, cfg *credentials.TransportCredentials) *tcpClient {
	t.Helper()
	c := &tcpClient{}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(*cfg),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			var d net.Dialer
			nc, err := d.DialContext(ctx, "tcp", a)
			if err == nil {
				c.mu.Lock()
				c.raw = append(c.raw, nc)
				c.mu.Unlock()
			}
			return nc, err
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	c.conn = conn
	return c
}

// cut closes the client's TCP connections under gRPC, as a killed process
// would: no stream is cancelled first.
func (c *tcpClient) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, nc := range c.raw {
		_ = nc.Close()
	}
}

// watch opens a WatchResources stream and returns nil once it synced, or
// the status the stream ended with.
func (c *tcpClient) watch(t *testing.T) *status.Status {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ws, err := dmv1.NewDeviceManagerServiceClient(c.conn).WatchResources(ctx, &dmv1.WatchResourcesRequest{})
	if err != nil {
		return status.Convert(err)
	}
	resp, err := ws.Recv()
	if err != nil {
		return status.Convert(err)
	}
	if resp.GetSynced() == nil {
		t.Fatalf("the stream began with %v, not the synced marker", resp)
	}
	return nil
}

// open opens n streams that must all sync.
func (c *tcpClient) open(t *testing.T, who string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if st := c.watch(t); st != nil {
			t.Fatalf("%s: stream %d of %d refused: %v", who, i+1, n, st)
		}
	}
}

// refusedFor opens one more stream and checks that it is refused with
// RESOURCE_EXHAUSTED saying every one of want.
func (c *tcpClient) refusedFor(t *testing.T, who string, want ...string) {
	t.Helper()
	st := c.watch(t)
	if st == nil {
		t.Fatalf("%s: a stream past the bound was served", who)
	}
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("%s: refused with %v, want RESOURCE_EXHAUSTED", who, st)
	}
	for _, w := range append(want, watchMethod) {
		if !strings.Contains(st.Message(), w) {
			t.Errorf("%s: refusal %q does not say %q", who, st.Message(), w)
		}
	}
}

// TestWatchBoundsByCertificate: over mutual TLS each client certificate is
// one caller. Readers and operators are held to the per-caller bound and,
// together, to the slots not kept for the services; an internal
// certificate takes the kept ones past any per-caller bound; a stream past
// a bound gets RESOURCE_EXHAUSTED naming it, with the numbers; and a
// client whose connection breaks gives its slots back.
func TestWatchBoundsByCertificate(t *testing.T) {
	dir := testutil.TempDir(t)
	serverCA, clientCA := newCA(t), newCA(t)
	limits := stream.SlotLimits{Total: 7, PerCaller: 2, Reserved: 3}
	addr, wb, reg := watchServer(t, dir, serverCA, clientCA, limits)
	later := time.Now().Add(time.Hour)
	client := func(name string, orgs ...string) *tcpClient {
		creds := credentials.NewTLS(clientConfig(t, dir, clientCA, serverCA, name, orgs, later))
		return newTCPClient(t, addr, &creds)
	}
	readerA, readerB, operator := client("reader-a", "nodeplug:reader"), client("reader-b", "nodeplug:reader"), client("operator-c", "nodeplug:operator")
	service := client("reconciler", "nodeplug:internal")

	readerA.open(t, "reader-a", 2)
	readerA.refusedFor(t, "reader-a past its own bound", "per-caller bound", `certificate "CN=reader-a`, "holds 2 watch streams", "the limit per caller is 2")
	// A second connection with the same certificate is the same caller.
	client("reader-a", "nodeplug:reader").refusedFor(t, "reader-a on a second connection", "per-caller bound", "reader-a")
	readerB.open(t, "reader-b", 2)
	// Readers and operators share the 4 slots not kept: reader-b's second
	// stream took the last.
	operator.refusedFor(t, "the operator, with every shared slot held", "total bound", "hold 4 watch streams", "the limit is 4", "7 in total", "3 kept for the services")
	// The services' certificate takes the kept slots, more than a
	// caller's bound, then meets the total.
	service.open(t, "the internal certificate", 3)
	service.refusedFor(t, "the internal certificate at the total", "total bound", "7 watch streams are open, the limit is 7")
	// Calls that are not Watch streams are not bounded.
	if _, err := dmv1.NewDeviceManagerServiceClient(readerA.conn).ListResources(context.Background(), &dmv1.ListResourcesRequest{}); err != nil {
		t.Fatalf("ListResources at the bound: %v", err)
	}
	slots := wb.Slots(watchMethod)
	if st := slots.Stats(); st != (stream.SlotStats{Open: 7, Shared: 4, Callers: 2}) {
		t.Fatalf("slots %+v, want 7 open, 4 shared by 2 callers", st)
	}

	// reader-a's connection breaks: its streams end on the server and
	// give their slots back, so another caller gets them.
	readerA.cut()
	testutil.WaitFor(t, "reader-a's slots given back", func() bool { return slots.Stats() == stream.SlotStats{Open: 5, Shared: 2, Callers: 1} })
	operator.open(t, "the operator, after reader-a left", 2)
	readerA = client("reader-a", "nodeplug:reader")
	readerA.refusedFor(t, "reader-a back, with every slot held", "total bound", "7 watch streams are open")

	for bound, want := range map[string]float64{"per_caller": 2, "total": 3} {
		if got := refusedCount(t, reg, bound); got != want {
			t.Errorf("nodeplug_watch_streams_refused_total{bound=%q} = %v, want %v", bound, got, want)
		}
	}
}

// refusedCount returns nodeplug_watch_streams_refused_total for the Watch
// method and bound, gathered from reg.
func refusedCount(t *testing.T, reg *prometheus.Registry, bound string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "nodeplug_watch_streams_refused_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["method"] == watchMethod && labels["bound"] == bound {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
