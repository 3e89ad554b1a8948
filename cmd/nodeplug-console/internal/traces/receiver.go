package traces

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strings"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Receiver is an OTLP/gRPC trace receiver (the collector's TraceService)
// that puts what it receives in a Store.
type Receiver struct {
	coltracepb.UnimplementedTraceServiceServer
	store *Store
}

// NewReceiver returns a receiver that fills store.
func NewReceiver(store *Store) *Receiver { return &Receiver{store: store} }

// Register serves the receiver on s.
func (r *Receiver) Register(s *grpc.Server) { coltracepb.RegisterTraceServiceServer(s, r) }

// Export implements the OTLP TraceService.
func (r *Receiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	r.store.Add(FromOTLP(req.GetResourceSpans()))
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// FromOTLP converts OTLP resource spans to spans for a Store. Spans with a
// malformed trace or span ID are skipped.
func FromOTLP(rss []*tracepb.ResourceSpans) []Incoming {
	var out []Incoming
	for _, rs := range rss {
		res := attrs(rs.GetResource().GetAttributes())
		service := "?"
		for _, kv := range res {
			if kv.Key == "service.name" {
				if s, ok := kv.Value.(string); ok && s != "" {
					service = s
				}
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				if len(sp.GetTraceId()) != 16 || len(sp.GetSpanId()) != 8 {
					continue
				}
				out = append(out, Incoming{Span: fromOTLPSpan(sp), Service: service, Resource: res, Bytes: proto.Size(sp) + len(service)})
			}
		}
	}
	return out
}

func fromOTLPSpan(sp *tracepb.Span) Span {
	tid := hex.EncodeToString(sp.GetTraceId())
	s := Span{
		TraceID:       tid,
		SpanID:        hex.EncodeToString(sp.GetSpanId()),
		OperationName: sp.GetName(),
		StartTime:     int64(sp.GetStartTimeUnixNano() / 1000),
		Tags:          attrs(sp.GetAttributes()),
	}
	if end, start := sp.GetEndTimeUnixNano(), sp.GetStartTimeUnixNano(); end > start {
		s.Duration = int64((end - start) / 1000)
	}
	if p := sp.GetParentSpanId(); len(p) == 8 {
		s.References = append(s.References, Reference{RefType: "CHILD_OF", TraceID: tid, SpanID: hex.EncodeToString(p)})
	}
	for _, l := range sp.GetLinks() {
		if len(l.GetTraceId()) == 16 && len(l.GetSpanId()) == 8 {
			s.References = append(s.References, Reference{RefType: "FOLLOWS_FROM", TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
		}
	}
	if k := sp.GetKind(); k != tracepb.Span_SPAN_KIND_UNSPECIFIED {
		s.Tags = append(s.Tags, tag("span.kind", "string", strings.ToLower(strings.TrimPrefix(k.String(), "SPAN_KIND_"))))
	}
	switch sp.GetStatus().GetCode() {
	case tracepb.Status_STATUS_CODE_ERROR:
		s.Tags = append(s.Tags, tag("otel.status_code", "string", "ERROR"), tag("error", "bool", true))
		if d := sp.GetStatus().GetMessage(); d != "" {
			s.Tags = append(s.Tags, tag("otel.status_description", "string", d))
		}
	case tracepb.Status_STATUS_CODE_OK:
		s.Tags = append(s.Tags, tag("otel.status_code", "string", "OK"))
	}
	for _, ev := range sp.GetEvents() {
		s.Tags = append(s.Tags, tag("event", "string", ev.GetName()))
	}
	return s
}

func attrs(kvs []*commonpb.KeyValue) []KeyValue {
	out := make([]KeyValue, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, value(kv.GetKey(), kv.GetValue()))
	}
	return out
}

func value(key string, v *commonpb.AnyValue) KeyValue {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return tag(key, "string", x.StringValue)
	case *commonpb.AnyValue_BoolValue:
		return tag(key, "bool", x.BoolValue)
	case *commonpb.AnyValue_IntValue:
		return tag(key, "int64", x.IntValue)
	case *commonpb.AnyValue_DoubleValue:
		return tag(key, "float64", x.DoubleValue)
	case *commonpb.AnyValue_BytesValue:
		return tag(key, "binary", base64.StdEncoding.EncodeToString(x.BytesValue))
	case *commonpb.AnyValue_ArrayValue:
		var parts []string
		for _, e := range x.ArrayValue.GetValues() {
			parts = append(parts, fmt.Sprint(value("", e).Value))
		}
		return tag(key, "string", "["+strings.Join(parts, ", ")+"]")
	default:
		return tag(key, "string", "")
	}
}

// tag is one attribute of Jaeger's shape.
func tag(key, typ string, value any) KeyValue {
	return KeyValue{Key: key, Type: typ, Value: value}
}
