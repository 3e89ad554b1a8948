package traces

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Filter selects traces for the list. The zero Filter selects every trace.
// Its fields are the query parameters of the traces page and of
// GET /api/traces, named as Jaeger's search names them where it has them.
type Filter struct {
	// Service and Operation select traces with a span of that service
	// (exact name) whose operation name contains Operation (any case).
	// Given both, one span must satisfy both, as in Jaeger's search.
	Service, Operation string
	// MinDuration is the least duration of the whole trace, in µs.
	MinDuration int64
	// Status is "ok" (no span failed), "error" (one did) or "" (either).
	Status string
	// Query is a trace ID, full or a prefix of it, or text that a span's
	// attribute value, operation name or service name contains (any
	// case): a plugin, driver or resource name, a socket path or a part
	// of it, a pod's or a claim's UID.
	Query string
}

// Status values of a Filter.
const (
	StatusOK    = "ok"
	StatusError = "error"
)

// The query parameters of a Filter.
const (
	paramService     = "service"
	paramOperation   = "operation"
	paramMinDuration = "minDuration"
	paramStatus      = "status"
	paramQuery       = "q"
)

// ParseFilter reads a Filter from query parameters. A malformed minimum
// duration or status is an error that names the parameter; the other fields
// are still read.
func ParseFilter(q url.Values) (Filter, error) {
	f := Filter{
		Service:   strings.TrimSpace(q.Get(paramService)),
		Operation: strings.TrimSpace(q.Get(paramOperation)),
		Status:    strings.ToLower(strings.TrimSpace(q.Get(paramStatus))),
		Query:     strings.TrimSpace(q.Get(paramQuery)),
	}
	var errs []string
	switch f.Status {
	case "", StatusOK, StatusError:
	default:
		errs = append(errs, fmt.Sprintf("status %q is neither %q nor %q", f.Status, StatusOK, StatusError))
		f.Status = ""
	}
	if s := strings.TrimSpace(q.Get(paramMinDuration)); s != "" {
		d, err := ParseDuration(s)
		if err != nil {
			errs = append(errs, err.Error())
		} else {
			f.MinDuration = d
		}
	}
	if len(errs) > 0 {
		return f, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return f, nil
}

// ParseDuration reads a minimum duration in µs: a Go duration ("250ms",
// "1.5s", "300us" or "300µs") or a plain number of milliseconds ("5").
func ParseDuration(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.ParseFloat(s, 64); err == nil {
		s = strconv.FormatFloat(n, 'f', -1, 64) + "ms"
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("minimum duration %q is not a duration such as 5ms, 1.5s or 300µs", s)
	}
	return d.Microseconds(), nil
}

// Values returns the filter as query parameters, without the empty ones.
func (f Filter) Values() url.Values {
	v := url.Values{}
	for k, s := range map[string]string{paramService: f.Service, paramOperation: f.Operation, paramStatus: f.Status, paramQuery: f.Query} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if f.MinDuration > 0 {
		v.Set(paramMinDuration, formatDuration(f.MinDuration))
	}
	return v
}

// formatDuration renders µs as ParseDuration reads them back.
func formatDuration(us int64) string {
	return (time.Duration(us) * time.Microsecond).String()
}

// IsZero reports whether the filter selects every trace.
func (f Filter) IsZero() bool { return f == Filter{} }

// Match reports whether t passes the filter.
func (f Filter) Match(t *Trace) bool {
	if f.IsZero() {
		return true
	}
	return f.matchSummary(Summarize(t)) && f.matchSpans(t)
}

// matchSummary checks what a trace's summary says: its duration and status.
func (f Filter) matchSummary(sum Summary) bool {
	if sum.Duration < f.MinDuration {
		return false
	}
	switch f.Status {
	case StatusOK:
		return !sum.Failed
	case StatusError:
		return sum.Failed
	}
	return true
}

// matchSpans checks what needs the spans: the service and operation, and
// the query.
func (f Filter) matchSpans(t *Trace) bool {
	op := strings.ToLower(f.Operation)
	if f.Service != "" || op != "" {
		found := false
		for i := range t.Spans {
			s := &t.Spans[i]
			if (f.Service == "" || t.Service(s) == f.Service) && (op == "" || strings.Contains(strings.ToLower(s.OperationName), op)) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return f.Query == "" || matchQuery(t, f.Query)
}

// matchQuery: q is the trace's ID or a prefix of it, or a span says q.
func matchQuery(t *Trace, q string) bool {
	q = strings.ToLower(q)
	if id := NormalizeID(q); id != "" && (strings.HasPrefix(t.TraceID, q) || t.TraceID == id) {
		return true
	}
	for i := range t.Spans {
		s := &t.Spans[i]
		if contains(s.OperationName, q) || contains(t.Service(s), q) {
			return true
		}
		for _, kv := range s.Tags {
			if v, ok := kv.Value.(string); ok && contains(v, q) {
				return true
			}
		}
	}
	return false
}

// contains reports whether s contains the lower-case q, in any case.
func contains(s, q string) bool {
	return strings.Contains(strings.ToLower(s), q)
}

// FullID returns the trace ID q names in full (32 hex digits, or 16 that
// Jaeger may give), normalized, or "" when q is not one.
func (f Filter) FullID() string {
	q := strings.ToLower(f.Query)
	if len(q) != 32 && len(q) != 16 {
		return ""
	}
	return NormalizeID(q)
}
