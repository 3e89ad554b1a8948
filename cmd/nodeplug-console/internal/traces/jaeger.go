package traces

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// ErrNotFound is returned for a trace no source holds.
var ErrNotFound = errors.New("trace not found")

// Jaeger reads traces from Jaeger's query API (the HTTP JSON one, port
// 16686).
type Jaeger struct {
	base   string
	client *http.Client
}

// NewJaeger returns a client of the query API at base (http://host:16686).
func NewJaeger(base string) (*Jaeger, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--jaeger-url %q is not an http(s) URL", base)
	}
	return &Jaeger{base: strings.TrimRight(base, "/"), client: &http.Client{Timeout: 10 * time.Second}}, nil
}

// URL is the query API's base URL.
func (j *Jaeger) URL() string { return j.base }

// Get fetches one trace.
func (j *Jaeger) Get(ctx context.Context, id string) (*Trace, error) {
	resp, err := j.query(ctx, "/api/traces/"+url.PathEscape(id))
	if err != nil {
		return nil, err
	}
	for i := range resp.Data {
		if t := &resp.Data[i]; len(t.Spans) > 0 {
			t.TraceID = NormalizeID(t.TraceID)
			for k := range t.Spans {
				t.Spans[k].TraceID = NormalizeID(t.Spans[k].TraceID)
				for r := range t.Spans[k].References {
					t.Spans[k].References[r].TraceID = NormalizeID(t.Spans[k].References[r].TraceID)
				}
			}
			sortSpans(t.Spans)
			return t, nil
		}
	}
	return nil, ErrNotFound
}

// Recent returns the latest traces whose spans include one of services,
// newest first, up to limit of each service.
func (j *Jaeger) Recent(ctx context.Context, services []string, limit int) ([]Summary, error) {
	seen := map[string]bool{}
	var out []Summary
	for _, svc := range services {
		q := url.Values{"service": {svc}, "limit": {fmt.Sprint(limit)}, "lookback": {"1h"}}
		resp, err := j.query(ctx, "/api/traces?"+q.Encode())
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				continue
			}
			return out, err
		}
		for i := range resp.Data {
			t := &resp.Data[i]
			t.TraceID = NormalizeID(t.TraceID)
			if t.TraceID == "" || seen[t.TraceID] {
				continue
			}
			seen[t.TraceID] = true
			out = append(out, Summarize(t))
		}
	}
	sortSummaries(out)
	return out, nil
}

func (j *Jaeger) query(ctx context.Context, path string) (*Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.base+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot reach Jaeger at %s: %w", j.base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading Jaeger's answer from %s: %w", j.base, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, ErrNotFound
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("query to Jaeger at %s: %s", j.base, resp.Status)
	}
	var r Response
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("what Jaeger at %s sent is not a trace list: %w", j.base, err)
	}
	return &r, nil
}

// Sources are where the console finds traces: its own store first, then
// Jaeger. Either may be nil.
type Sources struct {
	Local  *Store
	Jaeger *Jaeger
}

// Services whose traces Recent lists from Jaeger: the watcher roots every
// registration, the devicemanager every Allocate.
var Services = []string{"nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager"}

// Get returns the trace with id from the first source that holds it.
func (s Sources) Get(ctx context.Context, id string) (*Trace, error) {
	id = NormalizeID(id)
	if id == "" {
		return nil, fmt.Errorf("not a trace ID (up to 32 hex digits)")
	}
	if s.Local != nil {
		if t, ok := s.Local.Get(id); ok {
			return t, nil
		}
	}
	if s.Jaeger != nil {
		return s.Jaeger.Get(ctx, id)
	}
	return nil, ErrNotFound
}

// Recent lists up to n traces of both sources, newest first.
func (s Sources) Recent(ctx context.Context, n int) ([]Summary, error) {
	var out []Summary
	seen := map[string]bool{}
	if s.Local != nil {
		for _, sum := range s.Local.Recent(n) {
			seen[sum.TraceID] = true
			out = append(out, sum)
		}
	}
	var err error
	if s.Jaeger != nil {
		var js []Summary
		js, err = s.Jaeger.Recent(ctx, Services, n)
		for _, sum := range js {
			if !seen[sum.TraceID] {
				out = append(out, sum)
			}
		}
	}
	sortSummaries(out)
	if len(out) > n {
		out = out[:n]
	}
	return out, err
}

// Changed returns a channel closed when the local store changes, or a timer
// when only Jaeger (which cannot say) is there.
func (s Sources) Changed() <-chan struct{} {
	if s.Jaeger == nil && s.Local != nil {
		return s.Local.Changed()
	}
	ch := make(chan struct{})
	var local <-chan struct{}
	if s.Local != nil {
		local = s.Local.Changed()
	}
	go func() {
		t := time.NewTimer(2 * time.Second)
		defer t.Stop()
		select {
		case <-t.C:
		case <-local:
		}
		close(ch)
	}()
	return ch
}

// sortSummaries orders traces newest first.
func sortSummaries(s []Summary) {
	slices.SortStableFunc(s, func(a, b Summary) int { return cmp.Compare(b.StartTime, a.StartTime) })
}
