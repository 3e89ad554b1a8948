package telemetry

import (
	"bytes"
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

func TestInjectExtractAndLogIDs(t *testing.T) {
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	ctx, span := tp.Tracer("t").Start(context.Background(), "root")
	defer span.End()

	carrier := Inject(ctx)
	if carrier["traceparent"] == "" {
		t.Fatalf("Inject gave %v, want a traceparent", carrier)
	}
	got := Extract(context.Background(), carrier)
	if TraceID(got) != span.SpanContext().TraceID().String() {
		t.Fatalf("Extract lost the trace: %q vs %q", TraceID(got), span.SpanContext().TraceID())
	}
	if Inject(context.Background()) != nil {
		t.Fatal("Inject without a span must be nil")
	}

	var buf bytes.Buffer
	log, err := NewLogger(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.InfoContext(ctx, "hello")
	if !strings.Contains(buf.String(), span.SpanContext().TraceID().String()) || !strings.Contains(buf.String(), `"span_id"`) {
		t.Fatalf("log line lacks trace and span IDs: %s", buf.String())
	}
	if _, err := NewLogger(&buf, "yaml", "info"); err == nil {
		t.Fatal("bad format accepted")
	}
	if _, err := NewLogger(&buf, "text", "loud"); err == nil {
		t.Fatal("bad level accepted")
	}
}
