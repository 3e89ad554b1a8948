package web

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/state"
	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/traces"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	wv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
)

const root = "/var/lib/kubelet"

// base is when the test traces start.
var base = time.Date(2026, 12, 2, 1, 0, 38, 0, time.UTC)

// otlpSpan is a span to add: its service, operation and one attribute.
type otlpSpan struct{ service, op, key, value string }

// addTrace adds trace number n to store: the first span the root, the
// others its children, each 2 ms long and starting 1 ms after the one
// before; failed: the last one ends with an error. It returns the ID.
func addTrace(store *traces.Store, n uint64, failed bool, spans ...otlpSpan) string {
	tid := make([]byte, 16)
	binary.BigEndian.PutUint64(tid, n*0x0123456789abcdef)
	binary.BigEndian.PutUint64(tid[8:], n)
	var rss []*tracepb.ResourceSpans
	for i, s := range spans {
		sid := make([]byte, 8)
		binary.BigEndian.PutUint64(sid, n*100+uint64(i)+1)
		start := uint64(base.UnixNano()) + uint64(i)*1e6
		sp := &tracepb.Span{TraceId: tid, SpanId: sid, Name: s.op, StartTimeUnixNano: start, EndTimeUnixNano: start + 2e6, Kind: tracepb.Span_SPAN_KIND_SERVER}
		if i > 0 {
			sp.ParentSpanId = make([]byte, 8)
			binary.BigEndian.PutUint64(sp.ParentSpanId, n*100+1)
		}
		if s.key != "" {
			sp.Attributes = []*commonpb.KeyValue{{Key: s.key, Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s.value}}}}
		}
		if failed && i == len(spans)-1 {
			sp.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: "boom"}
		}
		rss = append(rss, &tracepb.ResourceSpans{
			Resource:   &resourcepb.Resource{Attributes: []*commonpb.KeyValue{{Key: "service.name", Value: &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s.service}}}}},
			ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{sp}}},
		})
	}
	store.Add(traces.FromOTLP(rss))
	return hex.EncodeToString(tid)
}

// consoleTraces fills a store as a stack does: a registration, an
// allocation and a failed Validate.
func consoleTraces(store *traces.Store) (reg, alloc, failed string) {
	sock := root + "/plugins_registry/example-com_sample.sock"
	reg = addTrace(store, 1, false,
		otlpSpan{"nodeplug-watcher", "watcher.socket_created", "socket.path", sock},
		otlpSpan{"nodeplug-reconciler", "reconciler.register", "nodeplug.plugin.name", "example.com/sample"},
		otlpSpan{"nodeplug-devicemanager", "nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin", "server.address", root + "/nodeplug/devicemanager.sock"})
	alloc = addTrace(store, 2, false,
		otlpSpan{"nodeplug-devicemanager", "nodeplug.devicemanager.v1.DeviceManagerService/Allocate", "", ""},
		otlpSpan{"nodeplug-devicemanager", "allocate", "pod_uid", "pod-1"})
	failed = addTrace(store, 3, true,
		otlpSpan{"nodeplug-watcher", "watcher.socket_created", "socket.path", root + "/plugins_registry/gpu.sock"},
		otlpSpan{"nodeplug-reconciler", "reconciler.Validate", "", ""})
	return reg, alloc, failed
}

// listed returns the trace IDs of a traces fragment's rows, in order.
func listed(frag string) []string {
	var ids []string
	for _, m := range regexp.MustCompile(`<tr data-trace="([0-9a-f]{32})"`).FindAllStringSubmatch(frag, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

// TestTracesPageFilter: the traces page lists what its query's filter
// passes, fills the form with it, and its event stream carries the same
// filter, so that the live updates stay filtered; a filter that passes
// nothing says so; a minimum duration not understood is said, not
// ignored in silence.
func TestTracesPageFilter(t *testing.T) {
	store := traces.NewStore(traces.Limits{})
	reg, alloc, failed := consoleTraces(store)
	srv, token := newTestServer(t, &snapshots{}, store)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	page := func(query string) string {
		t.Helper()
		resp := get(t, ctx, srv.URL+"/traces?"+query, token)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET /traces?%s: status %d, %v", query, resp.StatusCode, err)
		}
		return string(body)
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", []string{failed, alloc, reg}},
		{"service=nodeplug-watcher", []string{failed, reg}},
		{"service=nodeplug-watcher&status=ok", []string{reg}},
		{"operation=socket_created&status=error", []string{failed}},
		{"q=" + reg[:20], []string{reg}},
		{"q=example.com%2Fsample", []string{reg}},
		{"q=plugins_registry%2Fgpu.sock", []string{failed}},
		{"q=pod-1", []string{alloc}},
		{"minDuration=2.5ms", []string{failed, alloc, reg}},
		{"minDuration=3.5ms", []string{reg}},
		{"minDuration=1h", nil},
	} {
		p := page(tc.query)
		if got := listed(p); strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("/traces?%s lists %v, want %v", tc.query, got, tc.want)
		}
		if tc.want == nil && !strings.Contains(p, `id="nomatch"`) {
			t.Errorf("/traces?%s lists nothing without saying that no trace passes", tc.query)
		}
	}

	p := page("service=nodeplug-watcher&operation=socket_created&minDuration=1ms&status=ok&q=sample")
	for _, want := range []string{
		`<option value="nodeplug-watcher" selected>`, `name="operation" value="socket_created"`, `name="minDuration" value="1ms"`,
		`<option value="ok" selected>`, `name="q" value="sample"`, `<option value="reconciler.Validate">`,
		`data-events="/events?view=traces&amp;minDuration=1ms&amp;operation=socket_created&amp;q=sample&amp;service=nodeplug-watcher&amp;status=ok"`,
	} {
		if !strings.Contains(p, want) {
			t.Errorf("the filtered page lacks %s", want)
		}
	}
	if p := page("minDuration=soon"); !strings.Contains(p, "minimum duration &#34;soon&#34; is not a duration") || len(listed(p)) != 3 {
		t.Errorf("a minimum duration not understood: the page does not say so, or does not list every trace:\n%s", p)
	}
	if t.Failed() {
		t.Fatalf("page:\n%s", p)
	}

	// The event stream of a filtered page sends the filtered view, and a
	// new trace that passes reaches it; one that does not, does not.
	resp := get(t, ctx, srv.URL+"/events?view=traces&service=nodeplug-watcher&status=ok", token)
	defer resp.Body.Close()
	events := readEvents(resp.Body)
	if first := <-events; strings.Join(listed(first), ",") != reg {
		t.Fatalf("the filtered stream's first event lists %v, want %s", listed(first), reg)
	}
	other := addTrace(store, 4, false, otlpSpan{"nodeplug-devicemanager", "allocate", "pod_uid", "pod-2"})
	next := addTrace(store, 5, false, otlpSpan{"nodeplug-watcher", "watcher.socket_deleted", "socket.path", root + "/plugins_registry/example-com_sample.sock"})
	for {
		select {
		case ev := <-events:
			got := listed(ev)
			if strings.Contains(ev, other) {
				t.Fatalf("the filtered stream sent a trace the filter does not pass:\n%s", ev)
			}
			if len(got) == 2 && got[0] == next && got[1] == reg {
				return
			}
		case <-ctx.Done():
			t.Fatal("the filtered stream did not send the new watcher trace")
		}
	}
}

// TestTracesJSON: GET /api/traces lists the traces its filter passes, as
// summaries that say the root span, its kind and service; limit bounds the
// list, not the count; a filter not understood is a 400 that says why.
func TestTracesJSON(t *testing.T) {
	store := traces.NewStore(traces.Limits{})
	reg, _, failed := consoleTraces(store)
	srv, token := newTestServer(t, &snapshots{}, store)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list := func(query string, code int) TraceList {
		t.Helper()
		resp := get(t, ctx, srv.URL+"/api/traces?"+query, token)
		defer resp.Body.Close()
		var l TraceList
		if err := json.NewDecoder(resp.Body).Decode(&l); err != nil || resp.StatusCode != code {
			t.Fatalf("GET /api/traces?%s: status %d, %v; want %d", query, resp.StatusCode, err, code)
		}
		return l
	}
	l := list("service=nodeplug-watcher&limit=1", 200)
	if l.Matched != 2 || len(l.Data) != 1 || l.Data[0].TraceID != failed || l.Data[0].Root != "watcher.socket_created" || l.Data[0].RootKind != "server" ||
		l.Data[0].Service != "nodeplug-watcher" || !l.Data[0].Failed {
		t.Errorf("service=nodeplug-watcher&limit=1: %+v, want the failed registration of 2", l)
	}
	if l := list("operation=RegisterPlugin", 200); len(l.Data) != 1 || l.Data[0].TraceID != reg || len(l.Data[0].Services) != 3 {
		t.Errorf("operation=RegisterPlugin: %+v, want the registration across 3 services", l)
	}
	if l := list("", 200); len(l.Data) != 3 || l.Matched != 3 {
		t.Errorf("no filter: %+v, want 3 traces", l)
	}
	if l := list("minDuration=1h", 200); len(l.Data) != 0 || l.Data == nil {
		t.Errorf("minDuration=1h: %+v, want an empty list", l)
	}
	for _, q := range []string{"minDuration=x", "status=maybe", "limit=0", "limit=many"} {
		if l := list(q, 400); len(l.Errors) != 1 || l.Errors[0].Code != 400 {
			t.Errorf("%s: %+v, want one error", q, l)
		}
	}
}

// TestWaterfallRuler: the trace page has a time ruler over the bars, 0
// first, in milliseconds, the ticks evenly spaced up to the trace's end,
// and the same ticks as grid lines in each bar.
func TestWaterfallRuler(t *testing.T) {
	store := traces.NewStore(traces.Limits{})
	reg, _, _ := consoleTraces(store)
	tr, ok := store.Get(reg)
	if !ok {
		t.Fatal("no registration trace")
	}
	frag, err := renderFragment("trace", waterfallOf(tr, root))
	if err != nil {
		t.Fatal(err)
	}
	// The registration lasts 4 ms: a tick every 1 ms.
	var labels []string
	for _, m := range regexp.MustCompile(`<text x="([0-9.]+)%" y="10" text-anchor="(\w+)">([^<]+)</text>`).FindAllStringSubmatch(frag, -1) {
		labels = append(labels, m[1]+"% "+m[2]+" "+m[3])
	}
	want := []string{"0% start 0ms", "25% middle 1ms", "50% middle 2ms", "75% middle 3ms", "100% end 4ms"}
	if strings.Join(labels, ", ") != strings.Join(want, ", ") {
		t.Errorf("ruler %v, want %v", labels, want)
	}
	if n := strings.Count(frag, `<line class="grid" x1="500"`); n != 3 {
		t.Errorf("%d bars with a grid line at the middle, want all 3", n)
	}
	for _, want := range []string{
		// A gRPC method's package apart, its whole name on hover.
		`<span class="op" title="nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin"><span class="pkg">nodeplug.devicemanager.v1.</span><span class="m">DeviceManagerService/RegisterPlugin</span></span>`,
		// A path beneath the root dir relative to it, whole on hover, free
		// to wrap at its joints only, with a search for the traces that
		// name it.
		`<dd title="/var/lib/kubelet/plugins_registry/example-com_sample.sock">plugins_<wbr>registry/<wbr>example-<wbr>com_<wbr>sample.<wbr>sock <a class="find" href="/traces?q=%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fexample-com_sample.sock"`,
		// The attributes' heading: the method, then its package, each
		// wrapping at its joints.
		`<h2 title="nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin">DeviceManagerService/<wbr>RegisterPlugin</h2><p class="muted pkg" title="nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin">nodeplug.<wbr>devicemanager.<wbr>v1.</p>`,
	} {
		if !strings.Contains(frag, want) {
			t.Errorf("the trace lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("fragment:\n%s", frag)
	}
}

// TestRulerSteps: ticks are 1, 2, 2.5 or 5 times a power of ten, four to
// ten of them, labelled in ms (s from 10 s), the last one at most
// the trace's end.
func TestRulerSteps(t *testing.T) {
	for _, tc := range []struct {
		total int64
		first string
		last  string
		n     int
	}{
		{10_850, "0ms", "10ms", 6},
		{734, "0ms", "0.6ms", 4},
		{1, "0ms", "0.001ms", 2},
		{3_000_000, "0ms", "3000ms", 7},
		{1_500_000, "0ms", "1500ms", 7},
		{15_000_000, "0s", "15.0s", 7},
		{60_000_000, "0s", "60s", 7},
		{0, "0ms", "0ms", 1},
	} {
		ticks := rulerOf(tc.total)
		if len(ticks) != tc.n || ticks[0].Label != tc.first || ticks[len(ticks)-1].Label != tc.last || ticks[len(ticks)-1].Pos > 100 {
			t.Errorf("rulerOf(%d) = %+v, want %d ticks from %s to %s", tc.total, ticks, tc.n, tc.first, tc.last)
		}
	}
}

// TestTablesUseTheSpace: the plugins view shows socket paths relative to
// the root dir, whole on hover; a generation as when its socket was made,
// the generation itself on hover; names and IDs in cells that cut them
// with an ellipsis rather than wrap them.
func TestTablesUseTheSpace(t *testing.T) {
	gen := "fe00:984ce3:b1796173238075413055"
	sock := root + "/plugins_registry/example-com_sample.sock"
	snap := state.Snapshot{
		Status: map[string]string{},
		Plugins: []*rcv1.Plugin{{
			SocketPath: sock, Name: "example.com/sample", Type: "DevicePlugin", Generation: gen, Endpoint: sock,
			State: rcv1.PluginState_PLUGIN_STATE_REGISTERED, LastTraceId: "43ad380b671c63f209f4f15eeab1884f",
		}},
		Sockets: []*wv1.SocketEvent{{Path: "/elsewhere/x.sock", Generation: "7"}},
	}
	frag, err := renderFragment("plugins", pluginsOf(snap, time.Now(), root))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`<td class="clip"><code class="path" title="` + sock + `">plugins_registry/example-com_sample.sock</code></td>`,
		`<td class="clip" title="example.com/sample">example.com/sample</td>`,
		`<span class="gen" title="socket generation ` + gen + `: inode 9981155 on device 0xfe00, created 2026-12-02 01:00:38.075 UTC; a new generation means the socket file was made again" data-generation="` + gen + `">created 01:00:38</span>`,
		`<td class="clip"><a id="plugin--var-lib-kubelet-plugins-registry-example-com-sample-sock-trace" href="/traces/43ad380b671c63f209f4f15eeab1884f" title="the last registration's trace, 43ad380b671c63f209f4f15eeab1884f"`,
		`href="/traces?q=plugins_registry%2fexample-com_sample.sock"`,
		// A path elsewhere stays whole; a generation of another form is
		// shown as it is.
		`<code class="path" title="/elsewhere/x.sock">/elsewhere/x.sock</code>`, `data-generation="7">7</span>`,
	} {
		if !strings.Contains(frag, want) {
			t.Errorf("the plugins view lacks %s", want)
		}
	}
	if strings.Contains(frag, "endpoint") {
		t.Error("an endpoint equal to the socket is shown again")
	}
	if t.Failed() {
		t.Logf("fragment:\n%s", frag)
	}
	if got := relPath(root, root); got.Short != root {
		t.Errorf("the root dir itself shortened to %q", got.Short)
	}
	if got := relPath(root, "/var/lib/kubelet-other/x"); got.Short != "/var/lib/kubelet-other/x" {
		t.Errorf("a sibling of the root dir shortened to %q", got.Short)
	}
	if got := relPath("", sock); got.Short != sock {
		t.Errorf("with no root dir %q became %q", sock, got.Short)
	}
	if got := opOf("prepare pod default/web-0"); got.Package != "" || got.Name != "prepare pod default/web-0" {
		t.Errorf("a span name with a slash that is no gRPC method split: %+v", got)
	}
}
