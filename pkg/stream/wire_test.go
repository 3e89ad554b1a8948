package stream_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// watchDesc is a one-method streaming service for the test: Watch streams
// the hub's items, after a synced marker (an empty value).
var watchDesc = grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}

const watchMethod = "/nodeplug.streamtest.Test/Watch"

// itemSize is what the test's items count for: their bytes.
func itemSize(b []byte) int { return len(b) }

// serveHub serves the hub's items over a real Unix socket with nodeplug's
// server (its interceptor maps the hub's errors) and returns a client
// connection.
func serveHub(t *testing.T, hub *stream.Hub[[]byte]) *grpc.ClientConn {
	t.Helper()
	desc := watchDesc
	desc.Handler = func(_ any, ss grpc.ServerStream) error {
		if err := ss.RecvMsg(&emptypb.Empty{}); err != nil {
			return err
		}
		sub, err := hub.Join(nil)
		if err != nil {
			return err
		}
		return stream.Serve(ss.Context(), sub,
			func(b []byte) error { return ss.SendMsg(wrapperspb.Bytes(b)) },
			func() error { return ss.SendMsg(wrapperspb.Bytes(nil)) })
	}
	srv, _ := rpcutil.NewServer(slog.New(slog.DiscardHandler))
	srv.RegisterService(&grpc.ServiceDesc{ServiceName: "nodeplug.streamtest.Test", HandlerType: (*any)(nil), Streams: []grpc.StreamDesc{desc}}, struct{}{})
	path := filepath.Join(testutil.TempDir(t), "s.sock")
	lis, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })
	conn, err := rpcutil.DialPeer(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// watch opens a stream and reads its synced marker (or its error).
func watch(ctx context.Context, conn *grpc.ClientConn) (grpc.ClientStream, error) {
	cs, err := conn.NewStream(ctx, &watchDesc, watchMethod)
	if err != nil {
		return nil, err
	}
	if err := cs.SendMsg(&emptypb.Empty{}); err != nil {
		return nil, err
	}
	if err := cs.CloseSend(); err != nil {
		return nil, err
	}
	m := &wrapperspb.BytesValue{}
	if err := cs.RecvMsg(m); err != nil {
		return nil, err
	}
	if len(m.GetValue()) != 0 {
		return nil, errors.New("first message is not the synced marker")
	}
	return cs, nil
}

// Past the hub's count of subscribers a new stream gets RESOURCE_EXHAUSTED
// on the wire; a stream that ends makes room for the next.
func TestTooManyStreamsOnTheWire(t *testing.T) {
	const max = 3
	hub := stream.NewBoundedHub(stream.Limits{Subscribers: max}, itemSize)
	conn := serveHub(t, hub)
	var cancels []context.CancelFunc
	for range max {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		if _, err := watch(ctx, conn); err != nil {
			t.Fatal(err)
		}
		cancels = append(cancels, cancel)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	if _, err := watch(ctx, conn); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("stream %d: %v, want RESOURCE_EXHAUSTED", max+1, err)
	}
	cancels[0]()
	testutil.WaitFor(t, "the cancelled stream gone", func() bool { return hub.Len() == max-1 })
	if _, err := watch(ctx, conn); err != nil {
		t.Fatalf("a stream after one ended: %v", err)
	}
}

// A client that stops reading is closed once the streams together would
// hold more than the hub's byte budget, while a client that reads gets
// every item; the hub never holds more than its budget, and gives it all
// back once the streams end. The stalled client, when it reads again, gets
// what was already on its way, then RESOURCE_EXHAUSTED.
func TestStalledStreamClosedOnTheWireReaderContinues(t *testing.T) {
	const item, items, budget = 16 << 10, 200, 256 << 10
	hub := stream.NewBoundedHub(stream.Limits{Bytes: budget, SubscriberBytes: 1 << 30, Items: 1 << 20}, itemSize)
	conn := serveHub(t, hub)
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	stalled, err := watch(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := watch(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	// The reader takes each item before the next is published: it keeps
	// up, the stalled stream does not.
	for i := range items {
		b := make([]byte, item)
		b[0] = byte(i)
		hub.Publish(b)
		if held := hub.Stats().Held; held > budget {
			t.Fatalf("hub holds %d bytes after item %d, past its budget of %d", held, i, budget)
		}
		m := &wrapperspb.BytesValue{}
		if err := reader.RecvMsg(m); err != nil {
			t.Fatalf("reader: item %d: %v", i, err)
		}
		if len(m.GetValue()) != item || m.GetValue()[0] != byte(i) {
			t.Fatalf("reader got item %d out of order", i)
		}
	}
	if st := hub.Stats(); st.Closed != 1 {
		t.Fatalf("stats %+v, want the stalled stream closed", st)
	}
	n := 0
	for {
		err := stalled.RecvMsg(&wrapperspb.BytesValue{})
		if err == nil {
			n++
			continue
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("stalled stream ended with %v after %d items, want RESOURCE_EXHAUSTED", err, n)
		}
		break
	}
	if n >= items {
		t.Fatalf("stalled stream got all %d items", n)
	}
	cancel()
	if err := reader.RecvMsg(&wrapperspb.BytesValue{}); err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("reader after cancel: %v", err)
	}
	testutil.WaitFor(t, "every stream gone and its bytes given back", func() bool {
		st := hub.Stats()
		return st.Subscribers == 0 && st.Held == 0
	})
}
