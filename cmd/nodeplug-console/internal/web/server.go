// Package web is the console's HTTP side: the pages (html/template over
// embedded HTML, CSS and a little JavaScript), their live updates as
// server-sent events, the trace JSON that nodeplugctl trace reads, the
// trace list's JSON (filtered as the traces page is), and the Guard in
// front of all of it.
package web

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/state"
	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/traces"
	"github.com/nodeplug/nodeplug/pkg/version"
)

//go:embed assets
var assets embed.FS

var templates = template.Must(template.ParseFS(assets, "assets/console.html"))

// State is what the pages show of the services.
type State interface {
	Snapshot() state.Snapshot
	Changed() <-chan struct{}
}

// Server serves the console.
type Server struct {
	state   State
	traces  traces.Sources
	guard   *Guard
	log     *slog.Logger
	sources string
	// MinInterval is the least time between two updates of one live view
	// (default 100 ms): a burst of changes becomes one update.
	MinInterval time.Duration
	// RootDir is the stack's root dir: the views show the paths beneath
	// it relative to it. Empty: paths are shown whole.
	RootDir string
}

// listLimit is how many traces the traces page lists.
const listLimit = 50

// apiListMax is the most traces GET /api/traces returns.
const apiListMax = 1000

// New returns the console's server.
func New(st State, src traces.Sources, guard *Guard, log *slog.Logger) *Server {
	var names []string
	if src.Local != nil {
		names = append(names, "the console's OTLP receiver")
	}
	if src.Jaeger != nil {
		names = append(names, "Jaeger at "+src.Jaeger.URL())
	}
	if len(names) == 0 {
		names = append(names, "none configured")
	}
	return &Server{state: st, traces: src, guard: guard, log: log, sources: strings.Join(names, " and "), MinInterval: 100 * time.Millisecond}
}

// Handler returns the console's routes behind the guard.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(assets, "assets")
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	// Browsers ask for /favicon.ico whatever a page links; it is the
	// same icon the pages name.
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, static, "favicon.svg")
	})
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/plugins", http.StatusSeeOther)
	})
	for _, v := range views {
		mux.HandleFunc("GET /"+v, s.page(v))
	}
	mux.HandleFunc("GET /traces/{id}", s.page("trace"))
	mux.HandleFunc("GET /pods/{namespace}/{name}", s.page("pod"))
	mux.HandleFunc("GET /events", s.events)
	mux.HandleFunc("GET /api/traces", s.tracesJSON)
	mux.HandleFunc("GET /api/traces/{id}", s.traceJSON)
	return s.guard.Wrap(mux)
}

type navItem struct {
	Href, Label string
	Current     bool
}

type pageData struct {
	Title, Events, Version, Sources, RootDir string
	Nav                                      []navItem
	Filter                                   *filterView
	Fragment                                 template.HTML
}

// views are the pages the navigation lists, in its order.
var views = []string{"plugins", "resources", "allocations", "dra", "pods", "traces"}

var titles = map[string]string{
	"plugins": "Plugins", "resources": "Resources", "allocations": "Allocations", "dra": "DRA", "pods": "Pods", "pod": "Pod",
	"traces": "Traces", "trace": "Trace",
}

// pageID is the id of a page of one thing: a trace's ID, a pod's
// NAMESPACE/NAME; "" for the other views.
func pageID(view string, r *http.Request) string {
	if view == "pod" {
		return r.PathValue("namespace") + "/" + r.PathValue("name")
	}
	return r.PathValue("id")
}

// checkID says what is wrong with a page's id.
func checkID(view, id string) error {
	switch view {
	case "trace":
		if traces.NormalizeID(id) == "" {
			return fmt.Errorf("%s is not a trace ID (up to 32 hex digits)", quote(id))
		}
	case "pod":
		_, _, err := splitPodID(id)
		return err
	}
	return nil
}

func (s *Server) page(view string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := pageID(view, r)
		if err := checkID(view, id); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		query := r.URL.Query()
		frag, err := s.render(r.Context(), view, id, query)
		if err != nil {
			s.log.Error("rendering", "view", view, "error", err)
			http.Error(w, "rendering the page failed: "+err.Error(), http.StatusInternalServerError)
			return
		}
		d := pageData{Title: titles[view], Version: version.Version, Sources: s.sources, RootDir: s.RootDir, Fragment: template.HTML(frag)}
		d.Events = "/events?view=" + view
		switch view {
		case "trace":
			d.Title = "Trace " + traces.NormalizeID(id)
			d.Events += "&id=" + traces.NormalizeID(id)
		case "pod":
			d.Title = "Pod " + id
			d.Events += "&id=" + url.QueryEscape(id)
		}
		if view == "traces" {
			services, operations := s.traces.Names(r.Context())
			d.Filter = filterViewOf(query, services, operations)
			if fq := filterQuery(query); len(fq) > 0 {
				d.Events += "&" + fq.Encode()
			}
		}
		for _, v := range views {
			d.Nav = append(d.Nav, navItem{"/" + v, titles[v], v == view || (v == "traces" && view == "trace") || (v == "pods" && view == "pod")})
		}
		var buf bytes.Buffer
		if err := templates.ExecuteTemplate(&buf, "page", d); err != nil {
			http.Error(w, "rendering the page failed: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(buf.Bytes())
	}
}

// render renders one view's live fragment (the part the events replace);
// query is the page's, which filters the traces view.
func (s *Server) render(ctx context.Context, view, id string, query url.Values) (string, error) {
	now := time.Now()
	var data any
	switch view {
	case "plugins":
		data = pluginsOf(s.state.Snapshot(), now, s.RootDir)
	case "resources":
		data = resourcesOf(s.state.Snapshot(), now, s.RootDir)
	case "allocations":
		data = allocationsOf(s.state.Snapshot(), now)
	case "dra":
		data = draOf(s.state.Snapshot(), now, s.RootDir)
	case "pods":
		data = podsOf(s.state.Snapshot(), now)
	case "pod":
		ns, name, err := splitPodID(id)
		if err != nil {
			return "", err
		}
		data = podOf(s.state.Snapshot(), ns, name, now)
	case "traces":
		data = s.tracesOf(ctx, query)
	case "trace":
		t, err := s.traces.Get(ctx, id)
		if err != nil {
			wf := waterfall{TraceID: traces.NormalizeID(id), Sources: s.sources}
			if !errors.Is(err, traces.ErrNotFound) {
				wf.Error = err.Error()
			}
			data = wf
		} else {
			data = waterfallOf(t, s.RootDir)
		}
	default:
		return "", fmt.Errorf("no view %q", view)
	}
	var buf bytes.Buffer
	err := templates.ExecuteTemplate(&buf, view, data)
	return buf.String(), err
}

// events streams a view's fragment as server-sent events: the current one
// at once, then a new one after each change that alters it.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	query := r.URL.Query()
	view, id := query.Get("view"), query.Get("id")
	if _, ok := titles[view]; !ok || checkID(view, id) != nil {
		http.Error(w, "events: unknown view, bad trace ID or bad pod NAMESPACE/NAME", http.StatusBadRequest)
		return
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "events: streaming unsupported", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	ctx := r.Context()
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	usesTraces := view == "trace" || view == "traces"
	last := ""
	for {
		// Take the channels before rendering, so a change during the
		// render wakes the next round.
		changed := s.state.Changed()
		var traceChanged <-chan struct{}
		if usesTraces {
			traceChanged = s.traces.Changed()
		}
		frag, err := s.render(ctx, view, id, query)
		if err != nil {
			return
		}
		if frag != last {
			if err := writeEvent(w, "update", frag); err != nil {
				return
			}
			flusher.Flush()
			last = frag
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-traceChanged:
		case <-keepalive.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			flusher.Flush()
			continue
		}
		select { // fold a burst of changes into one update
		case <-ctx.Done():
			return
		case <-time.After(s.MinInterval):
		}
	}
}

func writeEvent(w http.ResponseWriter, event, data string) error {
	var b strings.Builder
	b.WriteString("event: " + event + "\n")
	for _, line := range strings.Split(data, "\n") {
		b.WriteString("data: " + strings.TrimSuffix(line, "\r") + "\n")
	}
	b.WriteString("\n")
	_, err := fmt.Fprint(w, b.String())
	return err
}

// traceJSON serves one trace as Jaeger's GET /api/traces/<id> does.
func (s *Server) traceJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	t, err := s.traces.Get(r.Context(), r.PathValue("id"))
	var resp traces.Response
	code := http.StatusOK
	switch {
	case err == nil:
		resp.Data = []traces.Trace{*t}
	case errors.Is(err, traces.ErrNotFound):
		code = http.StatusNotFound
		resp.Data = []traces.Trace{}
		resp.Errors = []traces.ErrorItem{{Code: code, Msg: "trace not found in " + s.sources}}
	default:
		code = http.StatusBadGateway
		if traces.NormalizeID(r.PathValue("id")) == "" {
			code = http.StatusBadRequest
		}
		resp.Data = []traces.Trace{}
		resp.Errors = []traces.ErrorItem{{Code: code, Msg: err.Error()}}
	}
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(resp)
}

// tracesOf is the traces view: the latest traces that pass the filter in
// query.
func (s *Server) tracesOf(ctx context.Context, query url.Values) tracesView {
	v := tracesView{Sources: s.sources}
	f, err := traces.ParseFilter(query)
	if err != nil {
		v.FilterError = err.Error()
	}
	v.Filtered = !f.IsZero()
	list, matched, err := s.traces.Find(ctx, f, listLimit)
	if err != nil {
		v.Error = err.Error()
	}
	v.Matched = matched
	for _, t := range list {
		v.Traces = append(v.Traces, traceRowOf(t))
	}
	return v
}

// TraceList is the body of GET /api/traces: the latest traces that pass
// the filter of its query (service, operation, minDuration, status, q; and
// limit, default 50), newest first.
type TraceList struct {
	Data    []traces.Summary   `json:"data"`
	Matched int                `json:"matched"` // how many passed, of which Data are the latest
	Errors  []traces.ErrorItem `json:"errors,omitempty"`
}

// tracesJSON serves the trace list.
func (s *Server) tracesJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	q := r.URL.Query()
	resp := TraceList{Data: []traces.Summary{}}
	f, err := traces.ParseFilter(q)
	limit := listLimit
	if l := q.Get("limit"); l != "" {
		n, lerr := strconv.Atoi(l)
		if lerr != nil || n < 1 || n > apiListMax {
			err = errors.Join(err, fmt.Errorf("limit %q is not a number from 1 to %d", l, apiListMax))
		}
		limit = n
	}
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		resp.Errors = []traces.ErrorItem{{Code: http.StatusBadRequest, Msg: err.Error()}}
		_ = json.NewEncoder(w).Encode(resp)
		return
	}
	list, matched, err := s.traces.Find(r.Context(), f, limit)
	resp.Data = append(resp.Data, list...)
	resp.Matched = matched
	if err != nil {
		// What one source gave is still served, with the other's error.
		resp.Errors = []traces.ErrorItem{{Code: http.StatusBadGateway, Msg: err.Error()}}
	}
	_ = json.NewEncoder(w).Encode(resp)
}
