// Package telemetry sets up OpenTelemetry tracing for a nodeplug process and
// gives logs the trace and span IDs of the work they describe.
//
// The SDK is always installed (unless OTEL_SDK_DISABLED=true), so trace and
// span IDs exist for logs and API fields. Spans are recorded and exported
// over OTLP only when OTEL_EXPORTER_OTLP_ENDPOINT or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; OTEL_EXPORTER_OTLP_PROTOCOL (or
// its _TRACES_ variant) chooses grpc (the default) or http/protobuf. The
// other OTEL_* variables are read by the SDK and exporters themselves.
//
// Without an endpoint no span is recorded: each still gets its trace and
// span IDs, for the logs and the API, but no attributes, events or timings
// are collected for an exporter that does not exist. Its trace context goes
// on to the next process marked not sampled, so a process that does export
// records nothing of a trace begun in one that does not: give the three
// services the same OTEL_* settings.
package telemetry

import (
	"context"
	"errors"
	"os"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Propagator is the W3C trace-context propagator every process uses.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(
	propagation.TraceContext{}, propagation.Baggage{})

// Setup installs the global tracer provider and propagator for service and
// returns a function that flushes and stops them.
func Setup(ctx context.Context, service, version string) (shutdown func(context.Context) error, err error) {
	otel.SetTextMapPropagator(Propagator)
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		otel.SetTracerProvider(noop.NewTracerProvider())
		return func(context.Context) error { return nil }, nil
	}
	res, err := resource.Merge(
		resource.NewSchemaless(
			attribute.String("service.name", service),
			attribute.String("service.version", version),
			attribute.String("service.namespace", "nodeplug"),
		),
		// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win.
		resource.Environment(),
	)
	if err != nil {
		return nil, err
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if exportConfigured() {
		exp, err := newExporter(ctx)
		if err != nil {
			return nil, err
		}
		opts = append(opts,
			sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())),
			sdktrace.WithBatcher(utf8Exporter{exp}))
	} else {
		// IDs only: recording a span costs allocations and CPU on every
		// call (docs/performance.md has what it cost), and with no
		// exporter nothing would ever read it.
		opts = append(opts, sdktrace.WithSampler(sdktrace.NeverSample()))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	otel.SetTracerProvider(tp)
	return tp.Shutdown, nil
}

// exportConfigured reports whether an OTLP endpoint is set.
func exportConfigured() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

func newExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto {
	case "", "grpc":
		return otlptracegrpc.New(ctx)
	case "http/protobuf":
		return otlptracehttp.New(ctx)
	default:
		return nil, errors.New("OTEL_EXPORTER_OTLP_PROTOCOL " + proto + " is not supported (use grpc or http/protobuf)")
	}
}

// Tracer returns the named tracer from the global provider.
func Tracer(name string) trace.Tracer { return otel.Tracer(name) }

// Inject writes the W3C context of ctx into a map, for carrying a trace in an
// API message. It returns nil when ctx has no valid span.
func Inject(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	m := propagation.MapCarrier{}
	Propagator.Inject(ctx, m)
	return m
}

// Extract returns ctx with the remote span context carried in m, if any.
func Extract(ctx context.Context, m map[string]string) context.Context {
	if len(m) == 0 {
		return ctx
	}
	return Propagator.Extract(ctx, propagation.MapCarrier(m))
}

// TraceID returns the trace ID of the span in ctx, or "".
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}
