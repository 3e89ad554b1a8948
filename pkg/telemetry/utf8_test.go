package telemetry

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// collector is an OTLP/gRPC trace receiver in the test process.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans map[string]map[string]string // span name → string attributes
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				attrs := map[string]string{"status": sp.GetStatus().GetMessage()}
				for _, a := range sp.GetAttributes() {
					attrs[a.GetKey()] = a.GetValue().GetStringValue()
				}
				c.spans[sp.GetName()] = attrs
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// TestExportWithStringsThatAreNotUTF8: a span whose attribute and status
// hold bytes that are not UTF-8 (a socket path from a file name) is
// exported with them replaced, and the span exported in the same batch
// arrives too; without the replacement the whole batch fails to marshal.
func TestExportWithStringsThatAreNotUTF8(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &collector{spans: map[string]map[string]string{}}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, c)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	t.Setenv("OTEL_SDK_DISABLED", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+lis.Addr().String())
	t.Setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	shutdown, err := Setup(context.Background(), "utf8-test", "v0")
	if err != nil {
		t.Fatal(err)
	}
	odd := "/r/plugins_registry/bad\xff\xfe.sock"
	_, span := Tracer("t").Start(context.Background(), "odd")
	span.SetAttributes(attribute.String("socket.path", odd), attribute.StringSlice("list", []string{"ok", odd}))
	span.RecordError(errors.New("dial " + odd))
	span.SetStatus(codes.Error, "dial "+odd)
	span.End()
	_, span = Tracer("t").Start(context.Background(), "normal")
	span.SetAttributes(attribute.String("socket.path", "/r/plugins_registry/good.sock"))
	span.End()
	// Shutdown flushes the batch, one export holding both spans.
	if err := shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown (the export): %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.spans["normal"]["socket.path"] != "/r/plugins_registry/good.sock" {
		t.Errorf("the normal span was not exported: %v", c.spans)
	}
	got, ok := c.spans["odd"]
	if !ok {
		t.Fatalf("the span with the odd path was not exported: %v", c.spans)
	}
	if want := "/r/plugins_registry/bad\uFFFD.sock"; got["socket.path"] != want || got["status"] != "dial "+want {
		t.Errorf("odd span exported as %v, want path %q", got, want)
	}
	for k, v := range got {
		if !utf8.ValidString(v) {
			t.Errorf("attribute %s = %q", k, v)
		}
	}
}
