package traces

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
)

// Four traces as the services make them: a registration across the three
// services, an allocation, a failed registration of another plugin, and
// the trace a read would make if its caller sent no trace context (the
// service's own server span as root).
const (
	regID   = "43ad380b671c63f209f4f15eeab1884f"
	allocID = "9ef4d3bc57fd61f2266cd5d1643b49b0"
	failID  = "43ad99990000000000000000000000aa"
	readID  = "0000000000000000000000000000beef"
)

func span(tid, sid, parent, op, proc string, start, dur int64, tags ...KeyValue) Span {
	s := Span{TraceID: tid, SpanID: sid, OperationName: op, StartTime: start, Duration: dur, ProcessID: proc, Tags: tags}
	if parent != "" {
		s.References = []Reference{{RefType: "CHILD_OF", TraceID: tid, SpanID: parent}}
	}
	return s
}

func str(k, v string) KeyValue { return KeyValue{Key: k, Type: "string", Value: v} }

var procs = map[string]Process{
	"w": {ServiceName: "nodeplug-watcher"}, "r": {ServiceName: "nodeplug-reconciler"}, "d": {ServiceName: "nodeplug-devicemanager"},
}

func sampleTraces() []*Trace {
	const sock = "/tmp/np1/plugins_registry/example-com_sample.sock"
	return []*Trace{
		{TraceID: regID, Processes: procs, Spans: []Span{
			span(regID, "01", "", "watcher.socket_created", "w", 1_000_000, 10_850, str("socket.path", sock), str("span.kind", "producer")),
			span(regID, "02", "01", "reconciler.register", "r", 1_001_020, 9_830, str("nodeplug.socket_path", sock), str("nodeplug.plugin.name", "example.com/sample")),
			span(regID, "03", "02", "nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin", "d", 1_003_350, 5_230,
				str("server.address", "/tmp/np1/nodeplug/devicemanager.sock"), str("span.kind", "server")),
			span(regID, "04", "03", "connect example.com/sample", "d", 1_003_580, 1_530),
		}},
		{TraceID: allocID, Processes: procs, Spans: []Span{
			span(allocID, "11", "", "nodeplug.devicemanager.v1.DeviceManagerService/Allocate", "d", 2_000_000, 9_110, str("span.kind", "server")),
			span(allocID, "12", "11", "allocate", "d", 2_000_100, 8_000, str("pod_uid", "pod-1"), str("container", "main")),
		}},
		{TraceID: failID, Processes: procs, Spans: []Span{
			span(failID, "21", "", "watcher.socket_created", "w", 3_000_000, 400, str("socket.path", "/tmp/np1/plugins_registry/gpu.sock")),
			span(failID, "22", "21", "reconciler.register", "r", 3_000_100, 300, str("otel.status_code", "ERROR"), KeyValue{Key: "error", Type: "bool", Value: true}),
		}},
		{TraceID: readID, Processes: procs, Spans: []Span{
			span(readID, "31", "", "nodeplug.reconciler.v1.ReconcilerService/ListPlugins", "r", 4_000_000, 700, str("span.kind", "server")),
		}},
	}
}

// TestFilterMatch: each field of the filter on its own and together; a
// service and an operation must be one span's; the query finds a trace by
// its ID or a prefix of it, and by what its spans name.
func TestFilterMatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    Filter
		want []string
	}{
		{"none", Filter{}, []string{regID, allocID, failID, readID}},
		{"a service", Filter{Service: "nodeplug-watcher"}, []string{regID, failID}},
		{"a service no trace has", Filter{Service: "nodeplugctl"}, nil},
		{"an operation, any case, a part of it", Filter{Operation: "SOCKET_created"}, []string{regID, failID}},
		{"a gRPC method by its method name", Filter{Operation: "/Allocate"}, []string{allocID}},
		{"service and operation of one span", Filter{Service: "nodeplug-devicemanager", Operation: "RegisterPlugin"}, []string{regID}},
		{"service and operation of different spans", Filter{Service: "nodeplug-watcher", Operation: "RegisterPlugin"}, nil},
		{"a minimum duration", Filter{MinDuration: 9_000}, []string{regID, allocID}},
		{"a minimum duration equal to one", Filter{MinDuration: 9_110}, []string{regID, allocID}},
		{"an impossible minimum duration", Filter{MinDuration: 3_600_000_000}, nil},
		{"errors", Filter{Status: StatusError}, []string{failID}},
		{"ok", Filter{Status: StatusOK}, []string{regID, allocID, readID}},
		{"a full trace ID", Filter{Query: regID}, []string{regID}},
		{"a full trace ID in capitals", Filter{Query: strings.ToUpper(allocID)}, []string{allocID}},
		{"a prefix of two IDs", Filter{Query: "43ad"}, []string{regID, failID}},
		{"a prefix of one", Filter{Query: "43ad38"}, []string{regID}},
		{"an ID without its leading zeros, as Jaeger gives it", Filter{Query: "beef"}, []string{readID}},
		{"a plugin name", Filter{Query: "example.com/sample"}, []string{regID}},
		{"a socket path relative to the root dir", Filter{Query: "plugins_registry/gpu.sock"}, []string{failID}},
		{"a socket's file name", Filter{Query: "example-com_sample.sock"}, []string{regID}},
		{"a pod UID", Filter{Query: "pod-1"}, []string{allocID}},
		{"a service name", Filter{Query: "watcher"}, []string{regID, failID}},
		{"text no span has", Filter{Query: "no-such-thing"}, nil},
		{"everything at once", Filter{Service: "nodeplug-watcher", Operation: "socket_created", MinDuration: 1_000, Status: StatusOK, Query: "sample"}, []string{regID}},
		{"everything but the status", Filter{Service: "nodeplug-watcher", Operation: "socket_created", MinDuration: 1_000, Status: StatusError, Query: "sample"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, tr := range sampleTraces() {
				if tc.f.Match(tr) {
					got = append(got, tr.TraceID)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("%+v matched %v, want %v", tc.f, got, tc.want)
			}
		})
	}
}

// TestParseFilter: the query parameters in, the same parameters out; a
// duration with or without its unit; what is not understood is an error
// naming it, the rest of the filter still read.
func TestParseFilter(t *testing.T) {
	q := url.Values{"service": {"nodeplug-watcher"}, "operation": {" socket_created "}, "minDuration": {"1.5ms"}, "status": {"Error"}, "q": {"43ad"}, "view": {"traces"}}
	f, err := ParseFilter(q)
	want := Filter{Service: "nodeplug-watcher", Operation: "socket_created", MinDuration: 1500, Status: StatusError, Query: "43ad"}
	if err != nil || f != want {
		t.Fatalf("ParseFilter(%v) = %+v, %v; want %+v", q, f, err, want)
	}
	if back, _ := ParseFilter(f.Values()); back != f {
		t.Errorf("the filter read back from its Values %v is %+v, want %+v", f.Values(), back, f)
	}
	if v := (Filter{}).Values(); len(v) != 0 {
		t.Errorf("the zero filter's values %v, want none", v)
	}
	for in, us := range map[string]int64{"5": 5000, "0.25": 250, "300us": 300, "300µs": 300, "2s": 2_000_000, "1h": 3_600_000_000} {
		if got, err := ParseDuration(in); err != nil || got != us {
			t.Errorf("ParseDuration(%q) = %d, %v; want %d", in, got, err, us)
		}
	}
	f, err = ParseFilter(url.Values{"minDuration": {"soon"}, "status": {"bad"}, "service": {"nodeplug-watcher"}})
	if err == nil || !strings.Contains(err.Error(), `"soon"`) || !strings.Contains(err.Error(), `"bad"`) {
		t.Errorf("a bad duration and status: error %v, want one naming both", err)
	}
	if f != (Filter{Service: "nodeplug-watcher"}) {
		t.Errorf("with a bad duration and status the filter is %+v, want the service alone", f)
	}
	if _, err := ParseDuration("-5ms"); err == nil {
		t.Error("a negative duration was taken")
	}
}

// TestStoreFind: the store lists the traces that pass, newest first, up to
// the limit, and counts all that pass.
func TestStoreFind(t *testing.T) {
	store := NewStore(Limits{})
	for _, tr := range sampleTraces() {
		var in []Incoming
		for _, s := range tr.Spans {
			in = append(in, Incoming{Span: s, Service: tr.Processes[s.ProcessID].ServiceName, Bytes: 100})
		}
		store.Add(in)
	}
	got, matched := store.Find(Filter{Service: "nodeplug-watcher"}, 1)
	if matched != 2 || len(got) != 1 || got[0].TraceID != failID {
		t.Fatalf("Find(watcher, 1) = %+v, %d; want the newer of 2 matches (%s)", got, matched, failID)
	}
	got, matched = store.Find(Filter{Query: "pod-1"}, 10)
	if matched != 1 || len(got) != 1 || got[0].TraceID != allocID || got[0].Root != "nodeplug.devicemanager.v1.DeviceManagerService/Allocate" || got[0].RootKind != "server" {
		t.Errorf("Find(q=pod-1) = %+v, %d; want the allocation, rooted at its server span", got, matched)
	}
	if got, matched = store.Find(Filter{MinDuration: 3_600_000_000}, 10); len(got) != 0 || matched != 0 {
		t.Errorf("an impossible minimum duration found %+v", got)
	}
	if all := store.Recent(10); len(all) != 4 || all[0].TraceID != readID {
		t.Errorf("Recent = %+v, want the 4 traces, newest first", all)
	}
	svcs, ops := store.Names(100)
	if !slices.Equal(svcs, []string{"nodeplug-devicemanager", "nodeplug-reconciler", "nodeplug-watcher"}) || !slices.Contains(ops, "watcher.socket_created") || len(ops) != 7 {
		t.Errorf("Names = %v, %v", svcs, ops)
	}
	if _, ops := store.Names(2); len(ops) != 2 {
		t.Errorf("Names(2) gave %d operations", len(ops))
	}
}

// fakeJaeger serves Jaeger's query API over traces: the search by service
// (the latest limit traces with a span of it, as Jaeger's), one trace by
// ID, the services and their operations. It records the searches.
func fakeJaeger(t *testing.T, all []*Trace) (*httptest.Server, func() []url.Values) {
	var mu sync.Mutex
	var searches []url.Values
	mux := http.NewServeMux()
	write := func(w http.ResponseWriter, v any) { _ = json.NewEncoder(w).Encode(v) }
	mux.HandleFunc("GET /api/traces", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		searches = append(searches, r.URL.Query())
		mu.Unlock()
		resp := Response{Data: []Trace{}}
		for _, tr := range all {
			if (Filter{Service: r.URL.Query().Get("service")}).Match(tr) && len(resp.Data) < 2 {
				c := *tr
				c.TraceID = strings.TrimLeft(c.TraceID, "0") // Jaeger drops leading zeros
				resp.Data = append(resp.Data, c)
			}
		}
		write(w, resp)
	})
	mux.HandleFunc("GET /api/traces/{id}", func(w http.ResponseWriter, r *http.Request) {
		for _, tr := range all {
			if tr.TraceID == NormalizeID(r.PathValue("id")) {
				write(w, Response{Data: []Trace{*tr}})
				return
			}
		}
		w.WriteHeader(http.StatusNotFound)
		write(w, Response{Data: []Trace{}, Errors: []ErrorItem{{Code: 404, Msg: "trace not found"}}})
	})
	mux.HandleFunc("GET /api/services", func(w http.ResponseWriter, r *http.Request) {
		write(w, map[string][]string{"data": {"nodeplug-watcher", "jaeger-all-in-one"}})
	})
	mux.HandleFunc("GET /api/services/{svc}/operations", func(w http.ResponseWriter, r *http.Request) {
		write(w, map[string][]string{"data": {"watcher.socket_created"}})
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, func() []url.Values {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(searches)
	}
}

// TestJaegerFind: with Jaeger as the source, a filter's service is the
// only one searched; the rest is checked on the traces it sends; a whole
// trace ID finds its trace though no search listed it.
func TestJaegerFind(t *testing.T) {
	all := sampleTraces()
	srv, searches := fakeJaeger(t, all)
	j, err := NewJaeger(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	src := Sources{Jaeger: j}
	ctx := context.Background()
	got, matched, err := src.Find(ctx, Filter{Service: "nodeplug-watcher", Status: StatusOK}, 10)
	if err != nil || matched != 1 || len(got) != 1 || got[0].TraceID != regID {
		t.Fatalf("Find(watcher, ok) = %+v, %d, %v; want the registration alone", got, matched, err)
	}
	if s := searches(); len(s) != 1 || s[0].Get("service") != "nodeplug-watcher" || s[0].Get("limit") != "200" {
		t.Errorf("searches %v: want one, of the watcher, for the latest 200", s)
	}
	// The reconciler's and the devicemanager's searches return two traces
	// each (the fake's limit), not the read's: its full ID finds it.
	got, _, err = src.Find(ctx, Filter{Query: readID}, 10)
	if err != nil || len(got) != 1 || got[0].TraceID != readID {
		t.Errorf("Find(q=%s) = %+v, %v; want that trace", readID, got, err)
	}
	got, _, err = src.Find(ctx, Filter{Query: "0000000000000000000000000000dead"}, 10)
	if err != nil || len(got) != 0 {
		t.Errorf("an ID no source holds: %+v, %v; want nothing and no error", got, err)
	}
	svcs, ops := src.Names(ctx)
	if !slices.Contains(svcs, "jaeger-all-in-one") || !slices.Contains(svcs, "nodeplug-devicemanager") || !slices.Equal(ops, []string{"watcher.socket_created"}) {
		t.Errorf("Names = %v, %v", svcs, ops)
	}
}
