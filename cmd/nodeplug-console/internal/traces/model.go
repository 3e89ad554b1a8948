// Package traces holds the console's traces: a bounded in-memory store fed
// by its own OTLP/gRPC receiver, a client of Jaeger's query API, and the one
// shape both are served in — the JSON of Jaeger's GET /api/traces/<id>
// (times in microseconds), which nodeplugctl trace reads from either.
package traces

import (
	"slices"
	"sort"
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

// Summary describes a trace in a list.
type Summary struct {
	TraceID   string
	Root      string // the root span's operation name
	Service   string // the root span's service
	Services  []string
	Spans     int
	StartTime int64 // µs since the epoch
	Duration  int64 // µs
	Failed    bool
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
	}
	for s := range services {
		sum.Services = append(sum.Services, s)
	}
	sort.Strings(sum.Services)
	return sum
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
