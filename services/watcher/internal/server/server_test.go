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

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
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
func start(t *testing.T) *env { return startWith(t, 0) }

func startWith(t *testing.T, buffer int) *env {
	t.Helper()
	base := testutil.TempDir(t)
	dir := filepath.Join(base, "plugins_registry")
	conf, err := unixsock.NewConfiner([]string{base})
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	w, err := socketwatch.New(socketwatch.Options{Dir: dir, Confiner: conf, TracerProvider: tp, SubscriberBuffer: buffer})
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

type stream = grpc.ServerStreamingClient[watcherv1.WatchSocketEventsResponse]

func recv(t *testing.T, s stream) *watcherv1.WatchSocketEventsResponse {
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
	var streams []stream
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
// window, then the server-side buffer, and is closed with
// RESOURCE_EXHAUSTED; a client that reads gets every event meanwhile.
func TestStalledClientOverGRPC(t *testing.T) {
	const buffer, n = 16, 1000
	e := startWith(t, buffer)
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
		staleSocket(t, p)
		// Pace: the reader must not fall behind the small buffer.
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

// staleSocket leaves a socket file at path that nobody listens on.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()
}
