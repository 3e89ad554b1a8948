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
	return j.Find(ctx, services, Filter{}, limit)
}

// Find returns the latest traces whose spans include one of services and
// that pass f, newest first: of the latest limit traces of each service,
// those that pass. Jaeger is asked for the service and the operation when
// f names them; the rest of f is checked here, on whole traces.
func (j *Jaeger) Find(ctx context.Context, services []string, f Filter, limit int) ([]Summary, error) {
	if f.Service != "" {
		services = []string{f.Service}
	}
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
			if f.Match(t) {
				out = append(out, Summarize(t))
			}
		}
	}
	sortSummaries(out)
	return out, nil
}

// Names returns the services Jaeger knows, and the operations of those of
// services among them.
func (j *Jaeger) Names(ctx context.Context, services []string) (svcs, ops []string, err error) {
	var names struct {
		Data []string `json:"data"`
	}
	if err := j.get(ctx, "/api/services", &names); err != nil {
		return nil, nil, err
	}
	svcs = names.Data
	for _, svc := range services {
		if !slices.Contains(svcs, svc) {
			continue
		}
		names.Data = nil
		if err := j.get(ctx, "/api/services/"+url.PathEscape(svc)+"/operations", &names); err != nil {
			return svcs, ops, err
		}
		ops = append(ops, names.Data...)
	}
	return svcs, ops, nil
}

func (j *Jaeger) query(ctx context.Context, path string) (*Response, error) {
	var r Response
	if err := j.get(ctx, path, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// get reads the JSON at path into v.
func (j *Jaeger) get(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := j.client.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach Jaeger at %s: %w", j.base, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("reading Jaeger's answer from %s: %w", j.base, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return ErrNotFound
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("query to Jaeger at %s: %s", j.base, resp.Status)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("what Jaeger at %s sent is not what its query API sends: %w", j.base, err)
	}
	return nil
}

// Sources are where the console finds traces: its own store first, then
// Jaeger. Either may be nil.
type Sources struct {
	Local  *Store
	Jaeger *Jaeger
}

// Services whose traces Recent lists from Jaeger: the watcher roots every
// registration, the devicemanager every Allocate, the dramanager every
// PrepareResources.
var Services = []string{"nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager", "nodeplug-dramanager"}

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
	out, _, err := s.Find(ctx, Filter{}, n)
	return out, err
}

// Find lists up to n traces of both sources that pass f, newest first, and
// how many passed in all (of those the sources were asked for). A query
// that is a whole trace ID also finds that trace when it is older than
// the ones listed.
func (s Sources) Find(ctx context.Context, f Filter, n int) ([]Summary, int, error) {
	var out []Summary
	seen := map[string]bool{}
	add := func(sum Summary) {
		if !seen[sum.TraceID] {
			seen[sum.TraceID] = true
			out = append(out, sum)
		}
	}
	matched := 0
	if s.Local != nil {
		var local []Summary
		local, matched = s.Local.Find(f, n)
		for _, sum := range local {
			add(sum)
		}
	}
	var err error
	if s.Jaeger != nil {
		limit := n
		if !f.IsZero() {
			limit = max(n, jaegerFilteredLimit)
		}
		var js []Summary
		js, err = s.Jaeger.Find(ctx, Services, f, limit)
		before := len(out)
		for _, sum := range js {
			add(sum)
		}
		matched += len(out) - before
		if id := f.FullID(); id != "" && !seen[id] && err == nil {
			t, gerr := s.Jaeger.Get(ctx, id)
			if gerr == nil && f.Match(t) {
				add(Summarize(t))
				matched++
			} else if gerr != nil && !errors.Is(gerr, ErrNotFound) {
				err = gerr
			}
		}
	}
	sortSummaries(out)
	if len(out) > n {
		out = out[:n]
	}
	return out, matched, err
}

// jaegerFilteredLimit is how many of each service's latest traces a
// filtered list asks Jaeger for, to filter here.
const jaegerFilteredLimit = 200

// maxOperations bounds the operation names Names returns.
const maxOperations = 300

// Names returns the service names and the operation names the sources
// know, each sorted: the ones to offer in the list's filter.
func (s Sources) Names(ctx context.Context) (services, operations []string) {
	svc, ops := map[string]bool{}, map[string]bool{}
	for _, n := range Services {
		svc[n] = true
	}
	if s.Local != nil {
		ls, lo := s.Local.Names(maxOperations)
		for _, n := range ls {
			svc[n] = true
		}
		for _, n := range lo {
			ops[n] = true
		}
	}
	if s.Jaeger != nil {
		js, jo, _ := s.Jaeger.Names(ctx, Services) // the filter works without them
		for _, n := range js {
			svc[n] = true
		}
		for _, n := range jo {
			if len(ops) < maxOperations {
				ops[n] = true
			}
		}
	}
	return sortedKeys(svc), sortedKeys(ops)
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
