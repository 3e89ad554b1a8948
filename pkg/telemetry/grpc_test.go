package telemetry

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// A call over a socket that pkg/unixsock bound elsewhere and renamed into
// place is traced with the socket's path as server.address, on both sides,
// not the temporary name the kernel reports for the connection.
func TestUnixSpansNameThePathDialled(t *testing.T) {
	path := filepath.Join(testutil.TempDir(t), "api.sock")
	lis, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	// What the kernel says the server end is called: the name it was
	// bound with, not path. Without that this test would show nothing.
	raw, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	bound := raw.RemoteAddr().String()
	_ = raw.Close()
	if bound == path {
		t.Fatalf("the socket was bound at its own path %s: nothing to rename", path)
	}

	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	// The client handler is built for the global provider.
	otel.SetTracerProvider(tp)
	srv := grpc.NewServer(grpc.StatsHandler(ServerHandler(otelgrpc.WithTracerProvider(tp))))
	testgrpc.RegisterTestServiceServer(srv, testgrpc.UnimplementedTestServiceServer{})
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			srv.Stop()
			<-done
		}
	}
	defer stop()

	conn, err := grpc.NewClient("passthrough:///localhost",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}),
		grpc.WithStatsHandler(ClientHandler(path)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// Health checks are not traced; any other call is, answered or not.
	if _, err := testgrpc.NewTestServiceClient(conn).EmptyCall(context.Background(), &testgrpc.Empty{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("EmptyCall: %v, want Unimplemented", err)
	}

	kinds := map[trace.SpanKind]string{}
	testutil.WaitFor(t, "the client's and the server's span", func() bool {
		for _, s := range rec.Ended() {
			for _, a := range s.Attributes() {
				if a.Key == attribute.Key("server.address") {
					kinds[s.SpanKind()] = a.Value.AsString()
				}
			}
		}
		return len(kinds) == 2
	})
	for _, k := range []trace.SpanKind{trace.SpanKindClient, trace.SpanKindServer} {
		if got := kinds[k]; got != path {
			t.Errorf("%s span: server.address = %q, want %q (the bound name is %q)", k, got, path, bound)
		}
	}

	// Once the listener is closed its bound name is no longer mapped.
	stop()
	if _, ok := unixsock.ServedPath(bound); ok {
		t.Fatal("the bound name is still mapped after the listener closed")
	}
}

// Addresses that are not Unix socket paths are left to otelgrpc.
func TestClientHandlerLeavesTCPAlone(t *testing.T) {
	if _, ok := ClientHandler("127.0.0.1:50051").(*dialledHandler); ok {
		t.Fatal("a host:port address got the Unix path handler")
	}
	if _, ok := ClientHandler("/run/x.sock").(*dialledHandler); !ok {
		t.Fatal("a Unix socket path did not get the Unix path handler")
	}
}

// The otelgrpc handler is shared by every connection while the global
// providers and propagator stay the same, and built again when one is set.
func TestClientHandlerSharedUntilTheProvidersChange(t *testing.T) {
	inner := func(h stats.Handler) stats.Handler {
		if d, ok := h.(*dialledHandler); ok {
			return d.Handler
		}
		return h
	}
	first := inner(ClientHandler("/run/a.sock"))
	if inner(ClientHandler("/run/b.sock")) != first || inner(ClientHandler("127.0.0.1:1")) != first {
		t.Fatal("connections with the same providers got different handlers")
	}
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	otel.SetTracerProvider(tp)
	second := inner(ClientHandler("/run/a.sock"))
	if second == first {
		t.Fatal("a new tracer provider did not get a new handler")
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}))
	if inner(ClientHandler("/run/a.sock")) == second {
		t.Fatal("a new propagator did not get a new handler")
	}
}

func TestSameValue(t *testing.T) {
	a, b := &struct{ x int }{}, &struct{ x int }{}
	s := []int{1, 2}
	for _, tc := range []struct {
		x, y any
		want bool
	}{
		{nil, nil, true},
		{a, nil, false},
		{a, a, true},
		{a, b, false},
		{s, s, true},
		{s, s[:1], false},
		{s, []int{1, 2}, false},
		{struct{}{}, struct{}{}, true},
		{1, int64(1), false},
		{struct{ f any }{[]int{}}, struct{ f any }{[]int{}}, false}, // not comparable: said different, no panic
	} {
		if got := sameValue(tc.x, tc.y); got != tc.want {
			t.Errorf("sameValue(%#v, %#v) = %v, want %v", tc.x, tc.y, got, tc.want)
		}
	}
}
