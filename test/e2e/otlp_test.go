package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// span is one exported span, flattened.
type span struct {
	Service  string
	Kind     string // internal, server, client, producer or consumer
	Name     string
	TraceID  string
	SpanID   string
	ParentID string
	Links    []spanRef
	Start    time.Time
	End      time.Time
}

// spanRef is the target of a span link.
type spanRef struct{ TraceID, SpanID string }

// Span kinds as the sink records them.
const (
	kindInternal = "internal"
	kindServer   = "server"
	kindClient   = "client"
	kindProducer = "producer"
)

// kindName maps an OTLP span kind to the sink's name for it.
func kindName(k tracepb.Span_SpanKind) string {
	return strings.ToLower(strings.TrimPrefix(k.String(), "SPAN_KIND_"))
}

// otlpSink is an OTLP/gRPC trace receiver running in the test process.
type otlpSink struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []span
	addr  string
}

func startSink(t *testing.T) *otlpSink {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &otlpSink{addr: lis.Addr().String()}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, s)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return s
}

// Env is the environment that points a service at the sink.
func (s *otlpSink) Env() []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + s.addr,
		"OTEL_EXPORTER_OTLP_INSECURE=true",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
}

func (s *otlpSink) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		service := ""
		for _, a := range rs.GetResource().GetAttributes() {
			if a.GetKey() == "service.name" {
				service = a.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				var links []spanRef
				for _, l := range sp.GetLinks() {
					links = append(links, spanRef{TraceID: hex.EncodeToString(l.GetTraceId()), SpanID: hex.EncodeToString(l.GetSpanId())})
				}
				s.spans = append(s.spans, span{
					Service:  service,
					Kind:     kindName(sp.GetKind()),
					Name:     sp.GetName(),
					TraceID:  hex.EncodeToString(sp.GetTraceId()),
					SpanID:   hex.EncodeToString(sp.GetSpanId()),
					ParentID: hex.EncodeToString(sp.GetParentSpanId()),
					Links:    links,
					Start:    time.Unix(0, int64(sp.GetStartTimeUnixNano())),
					End:      time.Unix(0, int64(sp.GetEndTimeUnixNano())),
				})
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// Trace returns the spans of one trace, by start time.
func (s *otlpSink) Trace(traceID string) []span {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []span
	for _, sp := range s.spans {
		if sp.TraceID == traceID {
			out = append(out, sp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// waitFor waits until the spans of the trace satisfy cond and returns them.
// Spans are exported in batches, some after the reply that made them
// reached the test: a trace is complete when cond says so, not before.
func (s *otlpSink) waitFor(t *testing.T, traceID string, cond func([]span) error) []span {
	t.Helper()
	var spans []span
	testutil.Eventually(t, "trace "+traceID, func() error {
		spans = s.Trace(traceID)
		if err := cond(spans); err != nil {
			return fmt.Errorf("%w\nspans:\n%s", err, dump(spans))
		}
		return nil
	})
	return spans
}

func dump(spans []span) string {
	var b strings.Builder
	var t0 time.Time
	if len(spans) > 0 {
		t0 = spans[0].Start
	}
	for _, sp := range spans {
		fmt.Fprintf(&b, "  %-24s %-8s %-66s +%-9v %-9v id=%s parent=%s", sp.Service, sp.Kind, sp.Name,
			sp.Start.Sub(t0).Round(time.Microsecond), sp.End.Sub(sp.Start).Round(time.Microsecond), sp.SpanID, sp.ParentID)
		for _, l := range sp.Links {
			fmt.Fprintf(&b, " link=%s/%s", l.TraceID, l.SpanID)
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// spanSpec names one span precisely: the service that made it, its kind and
// its whole name. (A name alone is ambiguous: the client and the server of
// one RPC share it, and a step span is often named after the call it makes.)
type spanSpec struct{ service, kind, name string }

func (s spanSpec) String() string { return s.service + " " + s.kind + " span " + strconv.Quote(s.name) }

// find returns the first span matching spec.
func find(spans []span, spec spanSpec) (span, bool) {
	for _, sp := range spans {
		if sp.Service == spec.service && sp.Kind == spec.kind && sp.Name == spec.name {
			return sp, true
		}
	}
	return span{}, false
}

// findAll checks that every spec has a span in spans.
func findAll(spans []span, specs ...spanSpec) error {
	for _, spec := range specs {
		if _, ok := find(spans, spec); !ok {
			return fmt.Errorf("no %s", spec)
		}
	}
	return nil
}

// isDescendant reports whether span d descends from span a within spans.
func isDescendant(spans []span, d, a span) bool {
	byID := map[string]span{}
	for _, sp := range spans {
		byID[sp.SpanID] = sp
	}
	cur := d
	for i := 0; i < 64; i++ {
		if cur.ParentID == "" || cur.ParentID == "0000000000000000" {
			return false
		}
		if cur.ParentID == a.SpanID {
			return true
		}
		next, ok := byID[cur.ParentID]
		if !ok {
			return false
		}
		cur = next
	}
	return false
}
