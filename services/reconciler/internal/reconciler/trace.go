package reconciler

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

var tracer = telemetry.Tracer("github.com/nodeplug/nodeplug/services/reconciler")

// startSpan starts an operation's span: a child of the event's trace on the
// first attempt of a live event, else a new root; a retry links to the first
// attempt.
func startSpan(ctx context.Context, name string, carrier map[string]string, link trace.SpanContext, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{trace.WithAttributes(attrs...)}
	if link.IsValid() {
		opts = append(opts, trace.WithNewRoot(), trace.WithLinks(trace.Link{SpanContext: link, Attributes: []attribute.KeyValue{attribute.String("nodeplug.link", "first_attempt")}}))
	} else if len(carrier) > 0 {
		ctx = telemetry.Extract(ctx, carrier)
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	return tracer.Start(ctx, name, opts...)
}

func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// step runs f in a child span named name.
func step(ctx context.Context, name string, f func(ctx context.Context) error) error {
	ctx, span := tracer.Start(ctx, name)
	err := f(ctx)
	endSpan(span, err)
	return err
}

// pluginAttrs are the span attributes naming a registered plugin.
func pluginAttrs(p cache.Plugin) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.String("nodeplug.socket_path", p.SocketPath),
		attribute.String("nodeplug.generation", p.Generation),
		attribute.String("nodeplug.plugin.type", p.Type),
		attribute.String("nodeplug.plugin.name", p.Name),
	}
}
