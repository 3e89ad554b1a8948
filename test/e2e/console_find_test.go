package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// The console's finding aids in the browser: the plugins table's paths and
// generations, the waterfall's time ruler, the trace list's filter and
// search, and no trace of nodeplugctl's reads.

// pageErrors collects what the pages report as errors: uncaught
// exceptions, console.error, and the browser's own error entries (a
// refused script or style, a failed request). It starts collecting when
// told to, after the test's deliberate refusals.
type pageErrors struct {
	mu   sync.Mutex
	on   bool
	errs []string
}

// listen is a chromedp.WithListener func: it must return fast. It reads
// the events by their names and JSON (the DevTools protocol's), which keeps
// the protocol's Go types out of the module's direct requirements.
func (p *pageErrors) listen(ev any) {
	var e struct {
		ExceptionDetails *struct {
			Text      string `json:"text"`
			Exception *struct {
				Description string `json:"description"`
			} `json:"exception"`
		} `json:"exceptionDetails"`
		Type string `json:"type"`
		Args []struct {
			Value       json.RawMessage `json:"value"`
			Description string          `json:"description"`
		} `json:"args"`
		Entry *struct {
			Source, Level, Text, URL string
		} `json:"entry"`
	}
	var msg string
	switch fmt.Sprintf("%T", ev) {
	case "*runtime.EventExceptionThrown":
		if b, err := json.Marshal(ev); err != nil || json.Unmarshal(b, &e) != nil || e.ExceptionDetails == nil {
			msg = fmt.Sprintf("exception: %+v", ev)
			break
		}
		msg = "exception: " + e.ExceptionDetails.Text
		if e.ExceptionDetails.Exception != nil {
			msg += " " + e.ExceptionDetails.Exception.Description
		}
	case "*runtime.EventConsoleAPICalled":
		if b, err := json.Marshal(ev); err != nil || json.Unmarshal(b, &e) != nil || (e.Type != "error" && e.Type != "assert") {
			return
		}
		msg = "console." + e.Type + ":"
		for _, a := range e.Args {
			msg += " " + string(a.Value) + a.Description
		}
	case "*log.EventEntryAdded":
		if b, err := json.Marshal(ev); err != nil || json.Unmarshal(b, &e) != nil || e.Entry == nil || e.Entry.Level != "error" {
			return
		}
		msg = fmt.Sprintf("%s error: %s %s", e.Entry.Source, e.Entry.Text, e.Entry.URL)
	default:
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.on {
		p.errs = append(p.errs, msg)
	}
}

func (p *pageErrors) start() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.on = true
}

// check fails the test with the errors collected so far.
func (p *pageErrors) check(t *testing.T, when string) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.errs) > 0 {
		t.Errorf("the pages reported errors %s:\n%s", when, strings.Join(p.errs, "\n"))
		p.errs = nil
	}
}

// checkPluginsTable: the plugins table shows the socket relative to the
// root dir, the whole path on hover; the generation as when the socket was
// made, the generation itself on hover; the footer names the root dir;
// names, paths and IDs each on one line.
func checkPluginsTable(t *testing.T, b *browserTab, root string) {
	t.Helper()
	row := `tr[data-name="example.com/sample"]`
	sock := filepath.Join(layout.PluginsRegistryDir(root), "example-com_sample.sock")
	if got := b.text(row + ` code.path`); got != "plugins_registry/example-com_sample.sock" {
		t.Errorf("the plugin's socket shows as %q, want it relative to the root dir", got)
	}
	if got := b.eval(`document.querySelector('` + row + ` code.path').title`); got != sock {
		t.Errorf("the socket's title %q, want the whole path %q", got, sock)
	}
	if got := b.text(row + ` .gen`); !regexp.MustCompile(`^created \d\d:\d\d:\d\d$`).MatchString(got) {
		t.Errorf("the generation shows as %q, want when the socket was made", got)
	}
	if got := b.eval(`document.querySelector('` + row + ` .gen').title`); !strings.Contains(got, b.eval(`document.querySelector('`+row+` .gen').dataset.generation`)) {
		t.Errorf("the generation's title %q does not give the generation", got)
	}
	if got := b.text(`#rootdir`); got != root {
		t.Errorf("the footer names the root dir %q, want %q", got, root)
	}
	checkOneLine(t, b, row+` td.clip > *`)
}

// checkOneLine: the text of each element matching sel is on one line: the
// boxes of an inline element that wraps are on lines of their own.
func checkOneLine(t *testing.T, b *browserTab, sel string) {
	t.Helper()
	got := b.eval(`(() => {
		const bad = [];
		document.querySelectorAll(` + strconv.Quote(sel) + `).forEach(el => {
			const tops = new Set(Array.from(el.getClientRects()).filter(r => r.width > 0).map(r => Math.round(r.top)));
			if (tops.size > 1) bad.push(el.tagName + ' "' + el.textContent + '" on ' + tops.size + ' lines');
		});
		return bad.join('\n');
	})()`)
	if got != "" {
		t.Errorf("text that should keep to one line wraps:\n%s", got)
	}
}

// checkRuler: the trace's waterfall has a time ruler: ticks labelled in
// ms from 0, increasing left to right, the bars under it.
func checkRuler(t *testing.T, b *browserTab) {
	t.Helper()
	b.wait("the time ruler", `svg.ruler text`)
	labels := strings.Split(b.eval(`Array.from(document.querySelectorAll('svg.ruler text')).map(t => t.textContent + ' ' + t.getBoundingClientRect().left).join('\n')`), "\n")
	if len(labels) < 3 {
		t.Fatalf("the ruler has %d labels, want 3 or more: %q", len(labels), labels)
	}
	prevMS, prevX := -1.0, -1.0
	for i, l := range labels {
		text, x, _ := strings.Cut(l, " ")
		ms, err := strconv.ParseFloat(strings.TrimSuffix(text, "ms"), 64)
		left, xerr := strconv.ParseFloat(x, 64)
		if err != nil || xerr != nil || !strings.HasSuffix(text, "ms") || (i == 0 && ms != 0) || ms <= prevMS || left <= prevX {
			t.Fatalf("the ruler's labels %q: want 0ms first, then more ms further right", labels)
		}
		prevMS, prevX = ms, left
	}
	// The ruler spans the bars' column.
	span := b.eval(`(() => { const r = document.querySelector('svg.ruler').getBoundingClientRect(), b = document.querySelector('svg.bar').getBoundingClientRect(); return Math.round(r.left - b.left) + ' ' + Math.round(r.width - b.width); })()`)
	if span != "0 0" {
		t.Errorf("the ruler is off the bars' column by (left, width) %s px", span)
	}
}

// traceList reads GET /api/traces with query.
func traceList(t *testing.T, info consoleInfo, query url.Values) []traceSummary {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, info.URL+"/api/traces?"+query.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+info.Token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data   []traceSummary `json:"data"`
		Errors []struct{ Msg string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != http.StatusOK || len(list.Errors) > 0 {
		t.Fatalf("GET /api/traces?%s: status %d, %v, %+v", query.Encode(), resp.StatusCode, err, list.Errors)
	}
	return list.Data
}

type traceSummary struct {
	TraceID       string   `json:"traceID"`
	RootOperation string   `json:"rootOperation"`
	RootKind      string   `json:"rootKind"`
	RootService   string   `json:"rootService"`
	Services      []string `json:"services"`
}

func ids(list []traceSummary) map[string]bool {
	out := map[string]bool{}
	for _, s := range list {
		out[s.TraceID] = true
	}
	return out
}

// readRPC is the root a read of nodeplugctl's would leave if its calls
// were traced: the service's server span of a List or Watch method.
var readRPC = regexp.MustCompile(`^nodeplug\.\w+\.v1\.\w+/(List|Watch)\w*$`)

// checkNoReadTraces runs nodeplugctl's reads against the stack, then makes
// a registration (a second sample plugin) that every service traces after
// them. Each service exports its spans in the order they end, so once the
// console holds that registration's spans of all three services it holds
// any span the reads made. No trace may be rooted at a read's RPC.
func checkNoReadTraces(t *testing.T, info consoleInfo, root string) {
	t.Helper()
	for _, read := range [][]string{{"plugins"}, {"resources"}, {"allocations"}, {"sockets"}, {"drivers"}} {
		out, err := exec.Command(filepath.Join(binDir, "nodeplugctl"), append([]string{"--root-dir", root}, read...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("nodeplugctl %s: %v\n%s", read[0], err, out)
		}
	}
	other, err := stack.Start(filepath.Join(binDir, "nodeplug-sampleplugin"),
		[]string{"--root-dir", root, "--mode", "plugins-registry", "--resource", "example.com/other", "--devices", "1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = other.Stop(10 * time.Second) })
	testutil.Eventually(t, "the second plugin's registration trace, with spans of the three services", func() error {
		for _, s := range traceList(t, info, url.Values{"q": {"example.com/other"}, "operation": {"socket_created"}}) {
			if len(s.Services) == 3 {
				return nil
			}
		}
		return fmt.Errorf("not yet")
	})
	var reads []string
	for _, s := range traceList(t, info, url.Values{"limit": {"1000"}}) {
		if s.RootKind == "server" && readRPC.MatchString(s.RootOperation) {
			reads = append(reads, fmt.Sprintf("%s %s (%s)", s.TraceID, s.RootOperation, s.RootService))
		}
	}
	if len(reads) > 0 {
		t.Errorf("nodeplugctl's reads left traces of their own:\n%s", strings.Join(reads, "\n"))
	}
}

// checkTraceFilter drives the trace list's filter and search: a filter in
// the URL (linked, reloaded) shows the registration and hides the
// allocation; typing in the form filters the list in place and puts the
// filter in the URL; a trace ID prefix finds its trace alone; a resource
// name finds its plugin's registration; an impossible minimum duration
// shows none; the JSON list filters alike.
func checkTraceFilter(t *testing.T, b *browserTab, info consoleInfo, regTrace, allocTrace string) {
	t.Helper()
	row := func(id string) string { return `#traces tr[data-trace="` + id + `"]` }
	rows := func() string {
		return b.eval(`Array.from(document.querySelectorAll('#traces tbody tr')).map(r => r.dataset.trace + ' ' + r.dataset.root + ' ' + r.dataset.service).join('\n')`)
	}

	// A linked filter, as a reload opens it.
	b.do("open traces filtered by service and operation", chromedp.Navigate(info.URL+"/traces?service=nodeplug-watcher&operation=socket_created"))
	b.wait("the registration in the filtered list", row(regTrace))
	if b.eval(`document.querySelector('`+row(allocTrace)+`') ? 'shown' : 'hidden'`) != "hidden" {
		t.Errorf("the allocation's trace is listed under service=nodeplug-watcher&operation=socket_created:\n%s", rows())
	}
	for _, r := range strings.Split(rows(), "\n") {
		if f := strings.Fields(r); len(f) != 3 || f[1] != "watcher.socket_created" || f[2] != "nodeplug-watcher" {
			t.Errorf("a listed trace is not a watcher's socket_created: %q", r)
		}
	}
	if got := b.eval(`document.querySelector('#filter select[name="service"]').value + ' ' + document.querySelector('#filter input[name="operation"]').value`); got != "nodeplug-watcher socket_created" {
		t.Errorf("the form shows %q, want the filter of the URL", got)
	}

	// Typing in the form: the list follows without a reload, the URL too.
	b.do("open the whole list", chromedp.Navigate(info.URL+"/traces"))
	b.wait("the allocation in the whole list", row(allocTrace))
	b.wait("the registration in the whole list", row(regTrace))
	b.markPage()
	b.do("type an operation", chromedp.SendKeys(chromedp.CSS(`#filter input[name="operation"]`), "socket_created"))
	b.do("waiting for the allocation to leave the list", chromedp.WaitNotPresent(chromedp.CSS(row(allocTrace))))
	b.wait("the registration, still listed", row(regTrace))
	if got := b.eval(`location.search`); !strings.Contains(got, "operation=socket_created") {
		t.Errorf("the URL's query %q does not say the filter", got)
	}
	b.checkNoReload("the filter")
	b.eval(`(() => { const s = document.querySelector('#filter select[name="status"]'); s.value = 'error'; s.dispatchEvent(new Event('change', {bubbles: true})); return ''; })()`)
	b.do("waiting for the registration to leave the list", chromedp.WaitNotPresent(chromedp.CSS(row(regTrace))))
	b.do("clear the filter", chromedp.Click(chromedp.CSS(`#clear`)))
	b.wait("the allocation back in the list", row(allocTrace))
	if got := b.eval(`location.search`); got != "" {
		t.Errorf("after Clear the URL's query is %q", got)
	}
	b.checkNoReload("the filter's changes")

	// A trace ID's prefix finds that trace alone.
	b.do("search a trace ID prefix", chromedp.Navigate(info.URL+"/traces?q="+regTrace[:10]))
	b.wait("the registration found by its ID's prefix", row(regTrace))
	if got := rows(); strings.Count(got, "\n") != 0 {
		t.Errorf("the ID prefix %s lists more than its trace:\n%s", regTrace[:10], got)
	}

	// A resource name finds the registration of its plugin, not another's.
	b.do("search a resource", chromedp.Navigate(info.URL+"/traces?q=example.com%2Fother&operation=socket_created"))
	b.wait("example.com/other's registration", `#traces tbody tr`)
	if b.eval(`document.querySelector('`+row(regTrace)+`') ? 'shown' : 'hidden'`) != "hidden" {
		t.Errorf("the search for example.com/other lists example.com/sample's registration:\n%s", rows())
	}

	// An impossible minimum duration: none, said in words.
	b.do("filter by an impossible minimum duration", chromedp.Navigate(info.URL+"/traces?minDuration=1h"))
	b.wait("the empty result", `#nomatch`)
	if got := rows(); got != "" {
		t.Errorf("minDuration=1h lists traces:\n%s", got)
	}
	checkOneLine(t, b, `#filter label`)

	// The JSON list filters alike.
	got := ids(traceList(t, info, url.Values{"service": {"nodeplug-watcher"}, "operation": {"socket_created"}}))
	if !got[regTrace] || got[allocTrace] {
		t.Errorf("GET /api/traces?service=nodeplug-watcher&operation=socket_created: registration listed %v, allocation listed %v", got[regTrace], got[allocTrace])
	}
	if got := traceList(t, info, url.Values{"minDuration": {"1h"}}); len(got) != 0 {
		t.Errorf("GET /api/traces?minDuration=1h lists %d traces", len(got))
	}
}

// checkTraceTable: the whole list's rows keep IDs and names on one line,
// each trace ID whole on hover.
func checkTraceTable(t *testing.T, b *browserTab, regTrace string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, testutil.Deadline)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.WaitVisible(chromedp.CSS(`#traces tr[data-trace="`+regTrace+`"]`))); err != nil {
		t.Fatalf("the registration in the list: %v", err)
	}
	checkOneLine(t, b, `#traces td.clip > *`)
	if got := b.eval(`document.querySelector('#traces tr[data-trace="` + regTrace + `"] a').title`); got != regTrace {
		t.Errorf("the trace link's title %q, want the whole ID", got)
	}
}
