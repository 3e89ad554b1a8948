package traces

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// otlpSpan is a span of trace number t, span number s.
func otlpSpan(t, s, parent int, name string, pad int) *tracepb.Span {
	tid := make([]byte, 16)
	binary.BigEndian.PutUint64(tid[8:], uint64(t))
	sid := make([]byte, 8)
	binary.BigEndian.PutUint64(sid, uint64(s))
	sp := &tracepb.Span{TraceId: tid, SpanId: sid, Name: name, StartTimeUnixNano: uint64(1e15 + s*1000), EndTimeUnixNano: uint64(1e15 + s*1000 + 5000),
		Kind: tracepb.Span_SPAN_KIND_SERVER}
	if parent > 0 {
		sp.ParentSpanId = make([]byte, 8)
		binary.BigEndian.PutUint64(sp.ParentSpanId, uint64(parent))
	}
	if pad > 0 {
		sp.Attributes = []*commonpb.KeyValue{{Key: "pad", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: strings.Repeat("x", pad)}}}}
	}
	return sp
}

func request(service string, spans ...*tracepb.Span) *coltracepb.ExportTraceServiceRequest {
	return &coltracepb.ExportTraceServiceRequest{ResourceSpans: []*tracepb.ResourceSpans{{
		Resource:   &resourcepb.Resource{Attributes: []*commonpb.KeyValue{{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: service}}}}},
		ScopeSpans: []*tracepb.ScopeSpans{{Spans: spans}},
	}}}
}

func traceID(t int) string { return fmt.Sprintf("%032x", t) }

// serve runs a receiver over real gRPC on loopback and returns a client.
func serve(t *testing.T, store *Store) coltracepb.TraceServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	NewReceiver(store).Register(s)
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	cc, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	return coltracepb.NewTraceServiceClient(cc)
}

func export(t *testing.T, c coltracepb.TraceServiceClient, req *coltracepb.ExportTraceServiceRequest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Export(ctx, req); err != nil {
		t.Fatal(err)
	}
}

// TestReceiverKeepsTheLastNTraces: past MaxTraces the oldest trace goes,
// whole, and the newest stay readable in the Jaeger shape.
func TestReceiverKeepsTheLastNTraces(t *testing.T) {
	store := NewStore(Limits{MaxTraces: 3, MaxBytes: 1 << 20})
	c := serve(t, store)
	for tr := 1; tr <= 5; tr++ {
		export(t, c, request("nodeplug-watcher", otlpSpan(tr, tr*10+1, 0, "watcher.socket_created", 0)))
		export(t, c, request("nodeplug-reconciler", otlpSpan(tr, tr*10+2, tr*10+1, "reconciler.register", 0)))
	}
	if st := store.Stats(); st.Traces != 3 || st.Dropped != 4 {
		t.Fatalf("stats %+v, want 3 traces and 4 dropped spans", st)
	}
	for tr := 1; tr <= 5; tr++ {
		_, ok := store.Get(traceID(tr))
		if want := tr >= 3; ok != want {
			t.Errorf("trace %d kept %v, want %v", tr, ok, want)
		}
	}
	got, _ := store.Get(traceID(5))
	if len(got.Spans) != 2 || len(got.Processes) != 2 {
		t.Fatalf("trace 5: %d spans, %d processes, want 2 and 2: %+v", len(got.Spans), len(got.Processes), got)
	}
	child := got.Spans[1]
	if child.Parent() != got.Spans[0].SpanID || got.Service(&child) != "nodeplug-reconciler" || child.Duration != 5 {
		t.Errorf("child span %+v: want parent %s, service nodeplug-reconciler, 5µs", child, got.Spans[0].SpanID)
	}
	if rec := store.Recent(10); len(rec) != 3 || rec[0].TraceID != traceID(5) || rec[0].Root != "watcher.socket_created" || len(rec[0].Services) != 2 {
		t.Errorf("recent %+v: want traces 5, 4, 3, newest first, rooted at the watcher's span", rec)
	}
}

// TestReceiverByteCap: past MaxBytes the oldest traces go until the new
// span fits; a span larger than the cap alone is not kept; a span sent
// twice counts once.
func TestReceiverByteCap(t *testing.T) {
	const limit = 20_000
	store := NewStore(Limits{MaxTraces: 1000, MaxBytes: limit})
	c := serve(t, store)
	for tr := 1; tr <= 10; tr++ {
		export(t, c, request("svc", otlpSpan(tr, tr, 0, "big", 4000)))
		if st := store.Stats(); st.Bytes > limit {
			t.Fatalf("after trace %d the store holds %d bytes, over its cap of %d", tr, st.Bytes, limit)
		}
	}
	st := store.Stats()
	if st.Traces != 4 {
		t.Fatalf("stats %+v: want the 4 newest traces of ~4 kB under a 20 kB cap", st)
	}
	if _, ok := store.Get(traceID(10)); !ok {
		t.Error("the newest trace was evicted")
	}
	if _, ok := store.Get(traceID(6)); ok {
		t.Error("trace 6 is still there: the oldest should go first")
	}
	before := store.Stats()
	export(t, c, request("svc", otlpSpan(10, 10, 0, "big", 4000))) // an exporter's retry
	if after := store.Stats(); after != before {
		t.Errorf("a span sent again changed the store: %+v, then %+v", before, after)
	}
	export(t, c, request("svc", otlpSpan(99, 99, 0, "huge", limit)))
	if _, ok := store.Get(traceID(99)); ok {
		t.Error("a span larger than the cap was kept")
	}
	if after := store.Stats(); after.Traces != 4 || after.Dropped != before.Dropped+1 {
		t.Errorf("after a too-large span: %+v, want the 4 traces kept and one more dropped", after)
	}
}

// TestFromOTLPAttributes: kinds, status, links and attribute types arrive
// as the Jaeger shape names them, which nodeplugctl trace reads.
func TestFromOTLPAttributes(t *testing.T) {
	sp := otlpSpan(1, 2, 1, "op", 0)
	sp.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "boom"}
	sp.Links = []*tracepb.Span_Link{{TraceId: otlpSpan(7, 7, 0, "", 0).TraceId, SpanId: otlpSpan(7, 7, 0, "", 0).SpanId}}
	sp.Attributes = []*commonpb.KeyValue{
		{Key: "n", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: 42}}},
		{Key: "b", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: true}}},
	}
	bad := otlpSpan(1, 3, 0, "bad id", 0)
	bad.SpanId = []byte{1}
	in := FromOTLP(request("svc", sp, bad).GetResourceSpans())
	if len(in) != 1 {
		t.Fatalf("%d spans converted, want 1 (the one with a malformed ID is skipped)", len(in))
	}
	s := in[0].Span
	if !s.Failed() || s.Parent() != fmt.Sprintf("%016x", 1) {
		t.Errorf("span %+v: want failed, parent 1", s)
	}
	if len(s.References) != 2 || s.References[1].RefType != "FOLLOWS_FROM" || s.References[1].TraceID != traceID(7) {
		t.Errorf("references %+v: want the parent and a FOLLOWS_FROM link to trace 7", s.References)
	}
	tags := map[string]any{}
	for _, kv := range s.Tags {
		tags[kv.Key] = kv.Value
	}
	for k, want := range map[string]any{"n": int64(42), "b": true, "span.kind": "server", "otel.status_code": "ERROR", "otel.status_description": "boom"} {
		if tags[k] != want {
			t.Errorf("tag %s = %#v, want %#v", k, tags[k], want)
		}
	}
}

func TestNormalizeID(t *testing.T) {
	for in, want := range map[string]string{
		"ABC":                               "00000000000000000000000000000abc",
		"0af7651916cd43dd8448eb211c80319c":  "0af7651916cd43dd8448eb211c80319c",
		"":                                  "",
		"xyz":                               "",
		"0af7651916cd43dd8448eb211c80319c0": "",
	} {
		if got := NormalizeID(in); got != want {
			t.Errorf("NormalizeID(%q) = %q, want %q", in, got, want)
		}
	}
}
