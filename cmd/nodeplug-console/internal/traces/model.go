// Package traces holds the console's traces: a bounded in-memory store fed
// by its own OTLP/gRPC receiver, a client of Jaeger's query API, and the one
// shape both are served in — the JSON of Jaeger's GET /api/traces/<id>
// (times in microseconds), which nodeplugctl trace reads from either.
package traces

import (
	"slices"
	"sort"
	"strings"

	"github.com/nodeplug/nodeplug/internal/jaegertrace"
)

// The trace model is jaegertrace's: the shape the console serves.
type (
	Trace     = jaegertrace.Trace
	Span      = jaegertrace.Span
	Reference = jaegertrace.Reference
	KeyValue  = jaegertrace.KeyValue
	Process   = jaegertrace.Process
	Response  = jaegertrace.Response
	ErrorItem = jaegertrace.ErrorItem
)

// NormalizeID is jaegertrace.NormalizeID.
var NormalizeID = jaegertrace.NormalizeID

// Summary describes a trace in a list (and in GET /api/traces).
type Summary struct {
	TraceID   string   `json:"traceID"`
	Root      string   `json:"rootOperation"` // the root span's operation name
	RootKind  string   `json:"rootKind"`      // the root span's kind: server, client, internal…
	Service   string   `json:"rootService"`   // the root span's service
	Services  []string `json:"services"`
	Spans     int      `json:"spans"`
	StartTime int64    `json:"startTime"` // µs since the epoch
	Duration  int64    `json:"duration"`  // µs
	Failed    bool     `json:"error"`
}

// Summarize describes t.
func Summarize(t *Trace) Summary {
	sum := Summary{TraceID: t.TraceID, Spans: len(t.Spans)}
	if len(t.Spans) == 0 {
		return sum
	}
	ids := map[string]bool{}
	for i := range t.Spans {
		ids[t.Spans[i].SpanID] = true
	}
	services := map[string]bool{}
	start, end := t.Spans[0].StartTime, t.Spans[0].StartTime+t.Spans[0].Duration
	var root *Span
	for i := range t.Spans {
		s := &t.Spans[i]
		services[t.Service(s)] = true
		start = min(start, s.StartTime)
		end = max(end, s.StartTime+s.Duration)
		if s.Failed() {
			sum.Failed = true
		}
		if p := s.Parent(); (p == "" || !ids[p]) && (root == nil || s.StartTime < root.StartTime) {
			root = s
		}
	}
	sum.StartTime, sum.Duration = start, end-start
	if root != nil {
		sum.Root, sum.Service = root.OperationName, t.Service(root)
		for _, kv := range root.Tags {
			if v, ok := kv.Value.(string); ok && kv.Key == "span.kind" {
				sum.RootKind = v
			}
		}
	}
	for s := range services {
		sum.Services = append(sum.Services, s)
	}
	sort.Strings(sum.Services)
	return sum
}

// sortedKeys returns the keys of m, sorted.
func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// sortSpans orders spans by start time, then span ID.
func sortSpans(spans []Span) {
	slices.SortStableFunc(spans, func(a, b Span) int {
		if a.StartTime != b.StartTime {
			if a.StartTime < b.StartTime {
				return -1
			}
			return 1
		}
		return strings.Compare(a.SpanID, b.SpanID)
	})
}
