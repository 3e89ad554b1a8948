// Package jaegertrace is the one shape traces take between nodeplug's
// trace readers: the JSON of Jaeger's GET /api/traces/<id> (times in
// microseconds). The console serves its own receiver's traces in it and reads
// Jaeger's; nodeplugctl trace reads either. It also orders a trace's spans as
// a waterfall, the same for the console's page and nodeplugctl's text.
package jaegertrace

import (
	"fmt"
	"slices"
	"strings"
)

// Trace is one trace in the shape of Jaeger's query API.
type Trace struct {
	TraceID   string             `json:"traceID"`
	Spans     []Span             `json:"spans"`
	Processes map[string]Process `json:"processes"`
}

// Span is one span. StartTime is microseconds since the epoch, Duration
// microseconds.
type Span struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []Reference `json:"references"`
	StartTime     int64       `json:"startTime"`
	Duration      int64       `json:"duration"`
	Tags          []KeyValue  `json:"tags"`
	ProcessID     string      `json:"processID"`
}

// Reference points at a parent (CHILD_OF) or a linked span (FOLLOWS_FROM).
type Reference struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// KeyValue is one attribute. Type is Jaeger's: string, bool, int64,
// float64 or binary.
type KeyValue struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// Process is the emitting service.
type Process struct {
	ServiceName string     `json:"serviceName"`
	Tags        []KeyValue `json:"tags"`
}

// Response is the body of GET /api/traces/<id>.
type Response struct {
	Data   []Trace     `json:"data"`
	Errors []ErrorItem `json:"errors,omitempty"`
}

// ErrorItem is one error of a Response.
type ErrorItem struct {
	Code int    `json:"code"`
	Msg  string `json:"msg"`
}

// Service returns the service name of span s.
func (t *Trace) Service(s *Span) string {
	if p, ok := t.Processes[s.ProcessID]; ok && p.ServiceName != "" {
		return p.ServiceName
	}
	return "?"
}

// Parent returns the span ID of s's parent, "" for a root.
func (s *Span) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" && r.TraceID == s.TraceID {
			return r.SpanID
		}
	}
	return ""
}

// Failed reports whether the span ended with an error status.
func (s *Span) Failed() bool {
	for _, kv := range s.Tags {
		switch kv.Key {
		case "error":
			if v, ok := kv.Value.(bool); ok && v {
				return true
			}
		case "otel.status_code":
			if v, ok := kv.Value.(string); ok && v == "ERROR" {
				return true
			}
		}
	}
	return false
}

// NormalizeID returns a trace ID in the 32 lower-case hex digits OTLP gives,
// or "" when id is not one (Jaeger may drop leading zeros).
func NormalizeID(id string) string {
	id = strings.ToLower(id)
	if id == "" || len(id) > 32 {
		return ""
	}
	for _, r := range id {
		if !strings.ContainsRune("0123456789abcdef", r) {
			return ""
		}
	}
	return strings.Repeat("0", 32-len(id)) + id
}

// Row is one span of a waterfall: its index in Trace.Spans and its depth
// below its root.
type Row struct{ Index, Depth int }

// Waterfall orders t's spans as a waterfall: each root, then its children
// below it, depth first, siblings by start time (then span ID). A span's
// parent is the first span of this trace its CHILD_OF or FOLLOWS_FROM
// references name; a span whose parent is not in the trace is a root, and
// spans caught in a reference cycle are placed at the top level rather than
// left out.
func (t *Trace) Waterfall() []Row {
	spans := t.Spans
	byID := make(map[string]int, len(spans))
	for i := range spans {
		byID[spans[i].SpanID] = i
	}
	children := map[int][]int{}
	var roots []int
	for i := range spans {
		if p, ok := parentIndex(byID, &spans[i], i); ok {
			children[p] = append(children[p], i)
		} else {
			roots = append(roots, i)
		}
	}
	byStart := func(ids []int) {
		slices.SortStableFunc(ids, func(a, b int) int {
			sa, sb := &spans[a], &spans[b]
			if sa.StartTime != sb.StartTime {
				return compare(sa.StartTime, sb.StartTime)
			}
			return strings.Compare(sa.SpanID, sb.SpanID)
		})
	}
	byStart(roots)
	rows := make([]Row, 0, len(spans))
	seen := make([]bool, len(spans))
	var walk func(i, depth int)
	walk = func(i, depth int) {
		if seen[i] {
			return
		}
		seen[i] = true
		rows = append(rows, Row{i, depth})
		kids := children[i]
		byStart(kids)
		for _, k := range kids {
			walk(k, depth+1)
		}
	}
	for _, r := range roots {
		walk(r, 0)
	}
	for i := range spans {
		walk(i, 0)
	}
	return rows
}

func parentIndex(byID map[string]int, s *Span, self int) (int, bool) {
	for _, r := range s.References {
		if r.RefType != "CHILD_OF" && r.RefType != "FOLLOWS_FROM" {
			continue
		}
		if p, ok := byID[r.SpanID]; ok && p != self {
			return p, true
		}
	}
	return 0, false
}

func compare(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// FormatMicros renders a duration given in microseconds: 850µs, 1.25ms,
// 2.500s.
func FormatMicros(us int64) string {
	switch {
	case us < 1000:
		return fmt.Sprintf("%dµs", us)
	case us < 1_000_000:
		return fmt.Sprintf("%.2fms", float64(us)/1e3)
	default:
		return fmt.Sprintf("%.3fs", float64(us)/1e6)
	}
}
