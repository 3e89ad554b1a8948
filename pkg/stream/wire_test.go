package stream_test

import (
	"context"
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
// uint64 items from a hub.
var watchDesc = grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}

const watchMethod = "/nodeplug.streamtest.Test/Watch"

// A subscriber that falls behind gets RESOURCE_EXHAUSTED on the wire:
// Serve returns ErrSlow, a plain error, and nodeplug's server interceptor
// maps it. The items buffered before the overflow are delivered first.
func TestSlowSubscriberGetsResourceExhaustedOnTheWire(t *testing.T) {
	const buffer = 2
	hub := stream.NewHub[uint64](buffer)
	subscribed := make(chan struct{})
	serve := make(chan struct{})
	desc := watchDesc
	desc.Handler = func(_ any, ss grpc.ServerStream) error {
		if err := ss.RecvMsg(&emptypb.Empty{}); err != nil {
			return err
		}
		sub := hub.Subscribe()
		close(subscribed)
		// The test overflows the subscriber's buffer before Serve reads it.
		<-serve
		send := func(v uint64) error { return ss.SendMsg(wrapperspb.UInt64(v)) }
		return stream.Serve(ss.Context(), []uint64{100}, sub, send, func() error { return send(0) })
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
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	cs, err := conn.NewStream(ctx, &watchDesc, watchMethod)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(&emptypb.Empty{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CloseSend(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-subscribed:
	case <-ctx.Done():
		t.Fatal("the server never subscribed")
	}
	for i := range uint64(buffer + 1) {
		hub.Publish(i + 1) // the last one overflows the buffer
	}
	close(serve)

	var got []uint64
	for {
		m := &wrapperspb.UInt64Value{}
		err := cs.RecvMsg(m)
		if err != nil {
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("stream ended with %v after %v, want RESOURCE_EXHAUSTED", err, got)
			}
			break
		}
		got = append(got, m.GetValue())
	}
	want := []uint64{100, 0, 1, 2} // snapshot, synced, the buffered items
	if len(got) != len(want) {
		t.Fatalf("received %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("received %v, want %v", got, want)
		}
	}
}
