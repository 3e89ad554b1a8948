package web

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/signal"
	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/state"
	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/traces"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// snapshots is the narrow State the server reads: a snapshot that the test
// replaces, waking the views as state.State does.
type snapshots struct {
	mu      sync.Mutex
	snap    state.Snapshot
	changed signal.Signal
}

func (s *snapshots) Snapshot() state.Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snap
}

func (s *snapshots) Changed() <-chan struct{} { return s.changed.C() }

func (s *snapshots) set(snap state.Snapshot) {
	s.mu.Lock()
	s.snap = snap
	s.mu.Unlock()
	s.changed.Broadcast()
}

func resource(healthy, unhealthy, allocated []string) *dmv1.Resource {
	return &dmv1.Resource{Name: "example.com/sample", Capacity: 4, HealthyDeviceIds: healthy, UnhealthyDeviceIds: unhealthy, AllocatedDeviceIds: allocated}
}

func newTestServer(t *testing.T, st State, store *traces.Store) (*httptest.Server, string) {
	t.Helper()
	token := NewToken()
	s := New(st, traces.Sources{Local: store}, NewGuard(token, "127.0.0.1", nil), slog.New(slog.DiscardHandler))
	s.MinInterval = time.Millisecond
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv, token
}

func get(t *testing.T, ctx context.Context, url, token string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestEventsFollowChanges: the event stream sends the view at once, then
// the view again after a change (a device turning unhealthy), as HTML the
// page puts in place.
func TestEventsFollowChanges(t *testing.T) {
	st := &snapshots{}
	st.set(state.Snapshot{Resources: []*dmv1.Resource{resource([]string{"dev-0", "dev-1"}, nil, nil)}, Status: map[string]string{}})
	srv, token := newTestServer(t, st, traces.NewStore(traces.Limits{}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := get(t, ctx, srv.URL+"/events?view=resources", token)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	events := readEvents(resp.Body)
	first := <-events
	if !strings.Contains(first, `data-device="dev-0" data-state="healthy"`) {
		t.Fatalf("first event lacks dev-0 healthy:\n%s", first)
	}
	st.set(state.Snapshot{Resources: []*dmv1.Resource{resource([]string{"dev-1"}, []string{"dev-0"}, []string{"dev-1"})}, Status: map[string]string{}})
	select {
	case next := <-events:
		if !strings.Contains(next, `data-device="dev-0" data-state="unhealthy"`) || !strings.Contains(next, `data-device="dev-1" data-state="allocated"`) {
			t.Fatalf("the update does not show dev-0 unhealthy and dev-1 allocated:\n%s", next)
		}
	case <-ctx.Done():
		t.Fatal("no event after the change")
	}
}

// readEvents returns the data of each "update" event, lines joined.
func readEvents(r io.Reader) <-chan string {
	ch := make(chan string, 16)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<16), 1<<22)
		var data []string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "data: "):
				data = append(data, strings.TrimPrefix(line, "data: "))
			case line == "" && data != nil:
				ch <- strings.Join(data, "\n")
				data = nil
			}
		}
	}()
	return ch
}

// TestTraceJSON: /api/traces/<id> answers in Jaeger's shape, which
// nodeplugctl trace reads; an unknown trace is a 404 in the same shape.
func TestTraceJSON(t *testing.T) {
	store := traces.NewStore(traces.Limits{})
	tid := make([]byte, 16)
	binary.BigEndian.PutUint64(tid[8:], 7)
	store.Add(traces.FromOTLP([]*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{
		{TraceId: tid, SpanId: []byte{0, 0, 0, 0, 0, 0, 0, 1}, Name: "watcher.socket_created", StartTimeUnixNano: 2e9, EndTimeUnixNano: 3e9},
	}}}}}))
	srv, token := newTestServer(t, &snapshots{}, store)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp := get(t, ctx, srv.URL+"/api/traces/7", token)
	var r traces.Response
	err := json.NewDecoder(resp.Body).Decode(&r)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(r.Data) != 1 || len(r.Data[0].Spans) != 1 ||
		r.Data[0].Spans[0].OperationName != "watcher.socket_created" || r.Data[0].Spans[0].Duration != 1e6 {
		t.Fatalf("status %d, %v: %+v", resp.StatusCode, err, r)
	}
	resp = get(t, ctx, srv.URL+"/api/traces/8", token)
	r = traces.Response{}
	err = json.NewDecoder(resp.Body).Decode(&r)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 404 || len(r.Errors) != 1 {
		t.Fatalf("an unknown trace: status %d, %v: %+v", resp.StatusCode, err, r)
	}
	for _, path := range []string{"/plugins", "/resources", "/allocations", "/dra", "/pods", "/pods/default/absent", "/traces", "/traces/7", "/static/console.js"} {
		resp := get(t, ctx, srv.URL+path, token)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s: status %d", path, resp.StatusCode)
		}
	}
	// The pages name an icon, and /favicon.ico, which browsers ask for
	// whatever a page names, is the same icon: no page load ends in a 404.
	resp = get(t, ctx, srv.URL+"/plugins", token)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(page), `<link rel="icon" href="/static/favicon.svg"`) {
		t.Errorf("the plugins page links no icon:\n%s", page)
	}
	var icons [][]byte
	for _, path := range []string{"/static/favicon.svg", "/favicon.ico"} {
		resp := get(t, ctx, srv.URL+path, token)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "image/svg+xml" || !bytes.HasPrefix(body, []byte("<svg ")) {
			t.Errorf("GET %s: status %d, Content-Type %q, %.40q", path, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
		icons = append(icons, body)
	}
	if !bytes.Equal(icons[0], icons[1]) {
		t.Error("/favicon.ico is not the icon the pages link")
	}
}
