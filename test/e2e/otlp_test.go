package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/grpc"
)

// span is one exported span, flattened.
type span struct {
	Service  string
	Name     string
	TraceID  string
	SpanID   string
	ParentID string
	Links    []string // linked trace IDs
	Start    time.Time
	End      time.Time
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
				var links []string
				for _, l := range sp.GetLinks() {
					links = append(links, hex.EncodeToString(l.GetTraceId()))
				}
				s.spans = append(s.spans, span{
					Service:  service,
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

// waitFor polls the trace until cond holds or the deadline passes.
func (s *otlpSink) waitFor(t *testing.T, traceID string, cond func([]span) error) []span {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		spans := s.Trace(traceID)
		err := cond(spans)
		if err == nil {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s: %v\nspans:\n%s", traceID, err, dump(spans))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func dump(spans []span) string {
	var b strings.Builder
	var t0 time.Time
	if len(spans) > 0 {
		t0 = spans[0].Start
	}
	for _, sp := range spans {
		fmt.Fprintf(&b, "  %-24s %-66s +%-9v %-9v id=%s parent=%s\n", sp.Service, sp.Name,
			sp.Start.Sub(t0).Round(time.Microsecond), sp.End.Sub(sp.Start).Round(time.Microsecond), sp.SpanID, sp.ParentID)
	}
	return b.String()
}

// find returns the first span of service whose name contains substr.
func find(spans []span, service, substr string) (span, bool) {
	for _, sp := range spans {
		if sp.Service == service && strings.Contains(strings.ToLower(sp.Name), strings.ToLower(substr)) {
			return sp, true
		}
	}
	return span{}, false
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
