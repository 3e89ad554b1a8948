package server_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/watcher/internal/server"
	"github.com/nodeplug/nodeplug/services/watcher/internal/socketwatch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	dir    string
	w      *socketwatch.Watcher
	client watcherv1.WatcherServiceClient
	stopW  func()
	addr   string
}

// start runs a real watcher over a temporary directory behind a real gRPC
// server (nodeplug's server plumbing) on a Unix socket.
func start(t *testing.T) *env { return startWith(t, socketwatch.Options{}) }

// startWith starts the watcher with opts, its directory, confinement and
// tracer provider filled in.
func startWith(t *testing.T, opts socketwatch.Options) *env {
	t.Helper()
	base := testutil.TempDir(t)
	dir := filepath.Join(base, "plugins_registry")
	conf, err := unixsock.NewConfiner([]string{base})
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	opts.Dir, opts.Confiner, opts.TracerProvider = dir, conf, tp
	w, err := socketwatch.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = w.Run(ctx) }()
	stopW := func() { cancel(); <-runDone }
	t.Cleanup(stopW)

	srv, _ := rpcutil.NewServer(slog.New(slog.DiscardHandler))
	watcherv1.RegisterWatcherServiceServer(srv, server.New(w))
	lis, err := unixsock.Listen(filepath.Join(base, "watcher.sock"))
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })
	e := &env{dir: dir, w: w, stopW: stopW, addr: lis.Addr().String()}
	e.client = e.newClient(t)
	return e
}

func (e *env) newClient(t *testing.T, opts ...grpc.DialOption) watcherv1.WatcherServiceClient {
	t.Helper()
	conn, err := rpcutil.DialPeer(e.addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return watcherv1.NewWatcherServiceClient(conn)
}

func listen(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
}

type watchStream = grpc.ServerStreamingClient[watcherv1.WatchSocketEventsResponse]

func recv(t *testing.T, s watchStream) *watcherv1.WatchSocketEventsResponse {
	t.Helper()
	type result struct {
		m   *watcherv1.WatchSocketEventsResponse
		err error
	}
	c := make(chan result, 1)
	go func() { m, err := s.Recv(); c <- result{m, err} }()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("Recv: %v", r.err)
		}
		return r.m
	case <-time.After(testutil.Deadline):
		t.Fatal("no message within the deadline")
	}
	return nil
}

func TestWatchSnapshotSyncedLive(t *testing.T) {
	e := start(t)
	early := filepath.Join(e.dir, "early.sock")
	listen(t, early)
	// early.sock was created after the watcher started: wait until it is
	// known, so the snapshot below contains it.
	testutil.WaitFor(t, "early.sock seen", func() bool {
		socks, _ := e.w.List()
		return len(socks) == 1
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []watchStream
	for range 3 {
		s, err := e.client.WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	for i, s := range streams {
		snap := recv(t, s)
		ev := snap.GetEvent()
		if snap.GetInstanceId() != e.w.InstanceID() || ev == nil || !ev.GetSnapshot() || ev.GetPath() != early ||
			ev.GetType() != watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED || ev.GetGeneration() == "" ||
			len(ev.GetTraceContext()) != 0 || ev.GetObservedTime() == nil {
			t.Fatalf("stream %d: snapshot message %v", i, snap)
		}
		synced := recv(t, s)
		if synced.GetSynced() == nil || synced.GetSynced().GetSocketCount() != 1 ||
			synced.GetSynced().GetRevision() != ev.GetRevision() || synced.GetInstanceId() != e.w.InstanceID() {
			t.Fatalf("stream %d: synced message %v", i, synced)
		}
	}

	late := filepath.Join(e.dir, "nested", "late.sock")
	if err := os.Mkdir(filepath.Dir(late), 0o750); err != nil {
		t.Fatal(err)
	}
	listen(t, late)
	var created *watcherv1.SocketEvent
	for i, s := range streams {
		m := recv(t, s)
		ev := m.GetEvent()
		if m.GetInstanceId() != e.w.InstanceID() || ev.GetSnapshot() || ev.GetPath() != late ||
			ev.GetType() != watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED || ev.GetTraceContext()["traceparent"] == "" {
			t.Fatalf("stream %d: live message %v", i, m)
		}
		created = ev
	}

	list, err := e.client.ListSockets(ctx, &watcherv1.ListSocketsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if list.GetInstanceId() != e.w.InstanceID() || list.GetRevision() != created.GetRevision() || len(list.GetSockets()) != 2 ||
		list.GetSockets()[0].GetPath() != early || list.GetSockets()[1].GetPath() != late ||
		list.GetSockets()[1].GetGeneration() != created.GetGeneration() {
		t.Fatalf("ListSockets = %v", list)
	}

	if err := os.RemoveAll(filepath.Dir(late)); err != nil {
		t.Fatal(err)
	}
	for i, s := range streams {
		ev := recv(t, s).GetEvent()
		if ev.GetType() != watcherv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED || ev.GetPath() != late ||
			ev.GetGeneration() != created.GetGeneration() || ev.GetRevision() != created.GetRevision()+1 {
			t.Fatalf("stream %d: delete message %v", i, ev)
		}
	}

	// The watcher stopping ends every stream with UNAVAILABLE.
	e.stopW()
	for i, s := range streams {
		for {
			_, err := s.Recv()
			if err == nil {
				continue
			}
			if errors.Is(err, io.EOF) || status.Code(err) != codes.Unavailable {
				t.Fatalf("stream %d ended with %v, want UNAVAILABLE", i, err)
			}
			break
		}
	}
}

func TestEventToProto(t *testing.T) {
	now := time.Unix(1700000000, 5)
	for _, tc := range []struct {
		in   socketwatch.Event
		want watcherv1.SocketEventType
	}{
		{socketwatch.Event{Type: socketwatch.Created, Path: "/p/a.sock", Generation: "g", Revision: 7, ObservedTime: now,
			TraceContext: map[string]string{"traceparent": "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01"}},
			watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED},
		{socketwatch.Event{Type: socketwatch.Deleted, Path: "/p/a.sock", Generation: "g", Revision: 8, ObservedTime: now},
			watcherv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED},
		{socketwatch.Event{Type: socketwatch.Created, Path: "/p/b.sock", Generation: "h", Revision: 8, ObservedTime: now, Snapshot: true},
			watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED},
		{socketwatch.Event{}, watcherv1.SocketEventType_SOCKET_EVENT_TYPE_UNSPECIFIED},
	} {
		got := server.EventToProto(tc.in)
		if got.GetType() != tc.want || got.GetPath() != tc.in.Path || got.GetGeneration() != tc.in.Generation ||
			got.GetRevision() != tc.in.Revision || got.GetSnapshot() != tc.in.Snapshot ||
			!got.GetObservedTime().AsTime().Equal(tc.in.ObservedTime) ||
			got.GetTraceContext()["traceparent"] != tc.in.TraceContext["traceparent"] {
			t.Errorf("EventToProto(%+v) = %v", tc.in, got)
		}
	}
}

// TestStalledClientOverGRPC: a client that stops reading fills its HTTP/2
// window, then its queue on the server, and is closed with
// RESOURCE_EXHAUSTED once it passes its own bound (in events) or the
// service's byte budget for all streams; a client that reads gets every
// event meanwhile.
func TestStalledClientOverGRPC(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits stream.Limits
	}{
		{"events behind", stream.Limits{Items: 16}},
		{"bytes of all streams", stream.Limits{Bytes: 16 << 10, SubscriberBytes: 1 << 30, Items: 1 << 20}},
	} {
		t.Run(tc.name, func(t *testing.T) { testStalledClient(t, tc.limits) })
	}
}

func testStalledClient(t *testing.T, limits stream.Limits) {
	const n = 1000
	e := startWith(t, socketwatch.Options{Limits: limits})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Fixed 64 KiB windows (this also turns off window growth), so the
	// stalled stream blocks the server after a bounded number of events.
	stalledClient := e.newClient(t, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	stalled, err := stalledClient.WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m := recv(t, stalled); m.GetSynced() == nil {
		t.Fatalf("first message %v, want synced", m)
	}
	reader, err := e.client.WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m := recv(t, reader); m.GetSynced() == nil {
		t.Fatalf("first message %v, want synced", m)
	}
	for i := range n {
		p := filepath.Join(e.dir, fmt.Sprintf("s%04d.sock", i))
		testutil.StaleSocket(t, p)
		// Pace: the reader must not fall behind the small bounds.
		if ev := recv(t, reader).GetEvent(); ev.GetPath() != p {
			t.Fatalf("reader got %v, want CREATED %s", ev, p)
		}
	}
	got := 0
	for {
		_, err := stalled.Recv()
		if err != nil {
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("stalled stream ended with %v after %d events, want RESOURCE_EXHAUSTED", err, got)
			}
			break
		}
		got++
	}
	t.Logf("stalled stream got %d of %d events before RESOURCE_EXHAUSTED", got, n)
	if got >= n {
		t.Fatalf("stalled stream received all %d events; it was never dropped", got)
	}
}

// TestStreamBoundsOverGRPC: past the service's limit on streams,
// WatchSocketEvents answers RESOURCE_EXHAUSTED, and an ended stream makes
// room again; streams that stop reading after their synced marker hold no
// more than the service's byte budget however many events follow (the
// one holding the most is closed), and give it all back when they end.
func TestStreamBoundsOverGRPC(t *testing.T) {
	const max, budget, most = 8, 256 << 10, 50000
	reg := prometheus.NewRegistry()
	e := startWith(t, socketwatch.Options{Limits: stream.Limits{Subscribers: max, Bytes: budget}, Registerer: reg})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Fixed 64 KiB windows (this also turns off window growth), so stalled
	// streams block the server after a bounded number of events.
	stalledClient := e.newClient(t, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	for i := range max {
		s, err := stalledClient.WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if m := recv(t, s); m.GetSynced() == nil {
			t.Fatalf("stream %d: first message %v, want synced", i, m)
		}
	}
	extra, err := e.client.WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := extra.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("stream %d: %v, want RESOURCE_EXHAUSTED", max+1, err)
	}
	if got := metric(t, reg, "nodeplug_watcher_subscribers_refused_total"); got != 1 {
		t.Fatalf("refused counter = %v, want 1", got)
	}

	// Sockets appear until a stalled stream is closed: gRPC's own buffers
	// take the first events of each, the rest wait in its queue.
	sockets := 0
	for metric(t, reg, "nodeplug_watcher_slow_subscribers_dropped_total") == 0 {
		if sockets == most {
			t.Fatalf("%d sockets later no stalled stream was closed", most)
		}
		for range 100 {
			testutil.StaleSocket(t, filepath.Join(e.dir, fmt.Sprintf("s%05d.sock", sockets)))
			sockets++
		}
		testutil.WaitFor(t, "the sockets seen", func() bool { socks, _ := e.w.List(); return len(socks) == sockets })
		if held := metric(t, reg, "nodeplug_watcher_subscriber_bytes"); held > budget {
			t.Fatalf("the streams hold %v bytes, past the budget of %d", held, budget)
		}
	}

	cancel()
	testutil.WaitFor(t, "every stream gone and its bytes given back", func() bool {
		return metric(t, reg, "nodeplug_watcher_subscribers") == 0 && metric(t, reg, "nodeplug_watcher_subscriber_bytes") == 0
	})
	// The snapshot of a new stream must fit in the budget too: a few
	// sockets left.
	for i := 10; i < sockets; i++ {
		if err := os.Remove(filepath.Join(e.dir, fmt.Sprintf("s%05d.sock", i))); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "the sockets removed", func() bool { socks, _ := e.w.List(); return len(socks) == 10 })
	s, err := e.client.WatchSocketEvents(context.Background(), &watcherv1.WatchSocketEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if ev := recv(t, s).GetEvent(); !ev.GetSnapshot() {
			t.Fatalf("new stream: %v, want a snapshot event", ev)
		}
	}
	if m := recv(t, s); m.GetSynced().GetSocketCount() != 10 {
		t.Fatalf("new stream: %v, want synced with 10 sockets", m)
	}
}

// metric returns the value of the gauge or counter name in reg.
func metric(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}
