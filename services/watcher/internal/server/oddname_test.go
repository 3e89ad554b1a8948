package server_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	"github.com/nodeplug/nodeplug/internal/testutil"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/services/watcher/internal/server"
	"github.com/nodeplug/nodeplug/services/watcher/internal/socketwatch"
)

// wirePath is the path a socket message carries, as a client reads it.
func wirePath(t *testing.T, text string, b []byte) string {
	t.Helper()
	if !utf8.ValidString(text) {
		t.Fatalf("path field %q is not UTF-8", text)
	}
	p, err := bounds.PathFromWire(text, b)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestOddFileNameOverGRPC: a socket whose name is not UTF-8, beside a
// normal one, is carried by ListSockets and WatchSocketEvents (quoted in the
// path field, its bytes in path_bytes), and neither call fails for the
// normal socket; live events for both keep coming.
func TestOddFileNameOverGRPC(t *testing.T) {
	e := start(t)
	odd := filepath.Join(e.dir, "bad\xff\xfe.sock")
	normal := filepath.Join(e.dir, "good.sock")
	listen(t, odd)
	listen(t, normal)
	testutil.WaitFor(t, "both sockets seen", func() bool {
		socks, _ := e.w.List()
		return len(socks) == 2
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	list, err := e.client.ListSockets(ctx, &watcherv1.ListSocketsRequest{})
	if err != nil {
		t.Fatalf("ListSockets with a socket named %q: %v", odd, err)
	}
	got := map[string]*watcherv1.Socket{}
	for _, s := range list.GetSockets() {
		got[wirePath(t, s.GetPath(), s.GetPathBytes())] = s
	}
	if len(got) != 2 || got[odd] == nil || got[normal] == nil {
		t.Fatalf("ListSockets = %v, want %q and %q", list, odd, normal)
	}
	if s := got[odd]; s.GetPath() != bounds.PathText(odd) || string(s.GetPathBytes()) != odd {
		t.Errorf("odd socket carried as %q / %q", s.GetPath(), s.GetPathBytes())
	}
	if s := got[normal]; s.GetPath() != normal || s.GetPathBytes() != nil {
		t.Errorf("normal socket carried as %q / %q, want the path alone", s.GetPath(), s.GetPathBytes())
	}

	st, err := e.client.WatchSocketEvents(ctx, &watcherv1.WatchSocketEventsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap := map[string]bool{}
	for len(snap) < 2 {
		ev := recv(t, st).GetEvent()
		if ev == nil || !ev.GetSnapshot() {
			t.Fatalf("want two snapshot events, got %v after %v", ev, snap)
		}
		snap[wirePath(t, ev.GetPath(), ev.GetPathBytes())] = true
	}
	if !snap[odd] || !snap[normal] {
		t.Fatalf("snapshot = %v", snap)
	}
	if recv(t, st).GetSynced() == nil {
		t.Fatal("no synced marker after the snapshot")
	}

	// Live: a second odd name and a normal one, then the odd one removed.
	odd2 := filepath.Join(e.dir, "\xc3(.sock")
	listen(t, odd2)
	if ev := recv(t, st).GetEvent(); wirePath(t, ev.GetPath(), ev.GetPathBytes()) != odd2 ||
		ev.GetType() != watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED {
		t.Fatalf("live event %v, want %q created", ev, odd2)
	}
	normal2 := filepath.Join(e.dir, "good2.sock")
	listen(t, normal2)
	if ev := recv(t, st).GetEvent(); ev.GetPath() != normal2 || ev.GetPathBytes() != nil {
		t.Fatalf("live event %v, want %q created", ev, normal2)
	}
	if err := os.Remove(odd); err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, st).GetEvent(); wirePath(t, ev.GetPath(), ev.GetPathBytes()) != odd ||
		ev.GetType() != watcherv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED {
		t.Fatalf("live event %v, want %q deleted", ev, odd)
	}
}

// FuzzSocketPathWire: any byte string as a socket path goes through the
// watcher's API conversion, marshals, and comes back unchanged on the
// client's side (DESIGN "Bounds": no byte string a file name can hold
// fails a stream).
func FuzzSocketPathWire(f *testing.F) {
	for _, s := range []string{"/r/plugins_registry/a.sock", "/r/plugins_registry/bad\xff\xfe.sock", `/r/"q".sock`, `"/x"`, "/r/\xc3(", "/r/é.sock"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		msg := &watcherv1.WatchSocketEventsResponse{InstanceId: "i", Item: &watcherv1.WatchSocketEventsResponse_Event{
			Event: server.EventToProto(socketwatch.Event{Type: socketwatch.Created, Path: p, Generation: "g"}),
		}}
		list := server.ListToProto("i", []socketwatch.Socket{{Path: p, Generation: "g"}}, 1)
		for _, m := range []proto.Message{msg, list} {
			b, err := proto.Marshal(m)
			if err != nil {
				t.Fatalf("marshal with path %q: %v", p, err)
			}
			out := m.ProtoReflect().New().Interface()
			if err := proto.Unmarshal(b, out); err != nil {
				t.Fatalf("unmarshal with path %q: %v", p, err)
			}
			var text string
			var twin []byte
			switch o := out.(type) {
			case *watcherv1.WatchSocketEventsResponse:
				text, twin = o.GetEvent().GetPath(), o.GetEvent().GetPathBytes()
			case *watcherv1.ListSocketsResponse:
				text, twin = o.GetSockets()[0].GetPath(), o.GetSockets()[0].GetPathBytes()
			}
			if got, err := bounds.PathFromWire(text, twin); err != nil || got != p {
				t.Fatalf("path %q came back as %q, %v", p, got, err)
			}
		}
	})
}
