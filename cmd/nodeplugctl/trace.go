package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/nodeplug/nodeplug/internal/jaegertrace"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

func validTraceID(id string) bool {
	if id == "" || len(id) > 32 {
		return false
	}
	for _, r := range id {
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			return false
		}
	}
	return true
}

func cmdTrace(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("trace", "TRACE_ID")
	width := fs.Int("width", 40, "width of the waterfall bars in characters")
	source := fs.String("source", "auto", "where to read the trace: console (nodeplug-console, found through <root-dir>/nodeplug/"+layout.ConsoleInfoFileName+"), jaeger (--jaeger-url), or auto: the console when its file is there and --jaeger-url is not set, else Jaeger")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usagef("give one trace ID (from 'nodeplugctl plugins' or 'nodeplugctl allocations')")
	}
	id := strings.ToLower(pos[0])
	if !validTraceID(id) {
		return usagef("%q is not a trace ID (up to 32 hex digits)", pos[0])
	}
	if *width < 10 {
		return usagef("--width must be at least 10")
	}
	src, err := c.traceSource(*source)
	if err != nil {
		return err
	}
	tr, err := c.fetchTrace(ctx, src, id)
	if err != nil {
		return err
	}
	return renderWaterfall(c.stdout, tr, *width)
}

// traceSource is a query API that answers GET <base>/api/traces/<id> in
// Jaeger's JSON: Jaeger's own, or nodeplug-console's (with its token).
type traceSource struct {
	name  string // "Jaeger" or "the console"
	base  string
	token string
	file  string // the console's info file
}

// consoleInfo is the part of nodeplug-console's info file nodeplugctl reads.
type consoleInfo struct {
	URL   string `json:"url"`
	Token string `json:"token"`
}

// traceSource picks where traces are read: the console leaves its URL and
// token under the root dir when it runs (make run starts it); Jaeger is
// where make up's services send their spans.
func (c *cli) traceSource(which string) (traceSource, error) {
	file := layout.ConsoleInfoFile(c.g.rootDir)
	jaeger := traceSource{name: "Jaeger", base: strings.TrimRight(c.g.jaegerURL, "/")}
	switch which {
	case "jaeger":
	case "console", "auto":
		data, err := os.ReadFile(file)
		if err != nil {
			if which == "auto" && errors.Is(err, fs.ErrNotExist) {
				break
			}
			return traceSource{}, fmt.Errorf("cannot read the console's URL and token: %v — is nodeplug-console running with --root-dir %s? (make run starts it)", err, c.g.rootDir)
		}
		if which == "auto" && c.g.jaegerURL != app.DefaultJaegerURL {
			break // --jaeger-url given: the user asked for Jaeger
		}
		var ci consoleInfo
		if err := json.Unmarshal(data, &ci); err != nil || ci.URL == "" || ci.Token == "" {
			return traceSource{}, fmt.Errorf("%s does not hold the console's URL and token (%v); restart nodeplug-console", file, err)
		}
		return traceSource{name: "the console", base: strings.TrimRight(ci.URL, "/"), token: ci.Token, file: file}, nil
	default:
		return traceSource{}, usagef("--source %q: want auto, console or jaeger", which)
	}
	if u, err := url.Parse(jaeger.base); err != nil || u.Scheme == "" || u.Host == "" {
		return traceSource{}, usagef("--jaeger-url %q is not an http(s) URL", c.g.jaegerURL)
	}
	jaeger.file = file
	return jaeger, nil
}

// hint says how to get a trace source running.
func (s traceSource) hint() string {
	if s.token != "" {
		return "is nodeplug-console still running? (make run starts it; it left " + s.file + ")"
	}
	return "is it running? (make up starts Jaeger; under make run the console holds the traces and nodeplugctl finds it through " + s.file + "; or set --jaeger-url)"
}

func (c *cli) fetchTrace(ctx context.Context, src traceSource, id string) (*jaegertrace.Trace, error) {
	base := src.base
	cctx, cancel := c.call(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(cctx, http.MethodGet, base+"/api/traces/"+id, nil)
	if err != nil {
		return nil, err
	}
	if src.token != "" {
		req.Header.Set("Authorization", "Bearer "+src.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Errorf("no answer from %s at %s within %s (raise --timeout)", src.name, base, c.g.timeout)
		}
		return nil, fmt.Errorf("cannot reach %s at %s: %v — %s", src.name, base, err, src.hint())
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading %s's answer from %s: %v", src.name, base, err)
	}
	notFound := fmt.Errorf("trace %s not found in %s at %s — spans arrive only from services started with OTEL_EXPORTER_OTLP_ENDPOINT set (make run points them at the console, make up at Jaeger), a few seconds after the work they describe", id, src.name, base)
	if resp.StatusCode == http.StatusNotFound {
		return nil, notFound
	}
	if resp.StatusCode == http.StatusUnauthorized && src.token != "" {
		return nil, fmt.Errorf("the console at %s refused the token in %s: was it restarted? (its file is rewritten at each start)", base, src.file)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("query to %s at %s: %s: %s", src.name, base, resp.Status, excerpt(body))
	}
	var jr jaegertrace.Response
	if err := json.Unmarshal(body, &jr); err != nil {
		return nil, fmt.Errorf("what %s at %s sent is not a trace (%v): %s — is --jaeger-url the query service?", src.name, base, err, excerpt(body))
	}
	for _, t := range jr.Data {
		if len(t.Spans) > 0 {
			return &t, nil
		}
	}
	if len(jr.Errors) > 0 {
		return nil, fmt.Errorf("error from %s at %s: %s", src.name, base, jr.Errors[0].Msg)
	}
	return nil, notFound
}

func excerpt(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// renderWaterfall draws one row per span, children below their parent and
// indented, with its service, start offset from the trace's start, duration
// and a bar placed on a common time axis of width characters.
func renderWaterfall(w io.Writer, tr *jaegertrace.Trace, width int) error {
	spans := tr.Spans
	if len(spans) == 0 {
		return fmt.Errorf("trace %s has no spans", tr.TraceID)
	}
	start, end := spans[0].StartTime, spans[0].StartTime+spans[0].Duration
	services := map[string]bool{}
	for i := range spans {
		s := &spans[i]
		start = min(start, s.StartTime)
		end = max(end, s.StartTime+s.Duration)
		services[tr.Service(s)] = true
	}
	total := max(end-start, 1)
	fmt.Fprintf(w, "trace %s: %s, %s, %s\n\n", tr.TraceID, plural(len(spans), "span"), plural(len(services), "service"), jaegertrace.FormatMicros(total))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SERVICE\tSPAN\tSTART\tDURATION\tTIMELINE")
	for _, r := range tr.Waterfall() {
		s := &spans[r.Index]
		name := strings.Repeat("  ", r.Depth) + s.OperationName
		if s.Failed() {
			name += " (error)"
		}
		fmt.Fprintf(tw, "%s\t%s\t+%s\t%s\t%s\n", tr.Service(s), name, jaegertrace.FormatMicros(s.StartTime-start), jaegertrace.FormatMicros(s.Duration),
			bar(s.StartTime-start, s.Duration, total, width))
	}
	return tw.Flush()
}

// bar places [offset, offset+dur) on a time axis of width characters that
// spans total.
func bar(offset, dur, total int64, width int) string {
	from := int(offset * int64(width) / total)
	n := int((dur*int64(width) + total/2) / total)
	n = max(n, 1)
	from = min(from, width-1)
	n = min(n, width-from)
	return "|" + strings.Repeat(" ", from) + strings.Repeat("█", n) + strings.Repeat(" ", width-from-n) + "|"
}

func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}
