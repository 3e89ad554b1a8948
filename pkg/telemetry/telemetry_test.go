package telemetry

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
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

func TestSetupWithoutExporterRecordsNothingButKeepsIDs(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	prev := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(prev) })
	shutdown, err := Setup(context.Background(), "test", "v0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = shutdown(context.Background()) }()

	ctx, root := Tracer("t").Start(context.Background(), "root")
	defer root.End()
	if root.IsRecording() {
		t.Fatal("a span is recorded with no exporter to send it to")
	}
	if !root.SpanContext().HasTraceID() || !root.SpanContext().HasSpanID() {
		t.Fatalf("span without IDs: %v", root.SpanContext())
	}
	_, child := Tracer("t").Start(ctx, "child")
	defer child.End()
	if child.SpanContext().TraceID() != root.SpanContext().TraceID() || child.SpanContext().SpanID() == root.SpanContext().SpanID() {
		t.Fatalf("child %v of %v: want the same trace and its own span ID", child.SpanContext(), root.SpanContext())
	}
	// A caller's sampled context is not recorded either: nothing exports it.
	remote := Extract(context.Background(), map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
	_, served := Tracer("t").Start(remote, "served")
	defer served.End()
	if served.IsRecording() || served.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("served span %v recording=%v: want the caller's trace, not recorded", served.SpanContext(), served.IsRecording())
	}
	var buf bytes.Buffer
	log, err := NewLogger(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	log.InfoContext(ctx, "hello")
	if !strings.Contains(buf.String(), root.SpanContext().TraceID().String()) {
		t.Fatalf("log line lacks the trace ID: %s", buf.String())
	}
}
