package socketwatch

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listen creates a socket at path with a real listener, closed (and the file
// removed) at the end of the test.
func listen(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatalf("listen %s: %v", path, err)
	}
	t.Cleanup(func() { _ = l.Close() })
}

func mkdir(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(path, 0o750); err != nil {
		t.Fatal(err)
	}
}

type harness struct {
	dir     string // the watched directory
	outside string // a directory outside it (and outside the allowed dirs)
	w       *Watcher
	markers atomic.Int32
}

// setup prepares the directories; start starts the watcher over them. Tests
// that need sockets present before the start put them in between.
func setup(t *testing.T) *harness {
	t.Helper()
	base := testutil.TempDir(t)
	h := &harness{dir: filepath.Join(base, "reg"), outside: filepath.Join(base, "out")}
	mkdir(t, h.dir)
	mkdir(t, h.outside)
	return h
}

func (h *harness) options(t *testing.T) Options {
	t.Helper()
	conf, err := unixsock.NewConfiner([]string{h.dir})
	if err != nil {
		t.Fatal(err)
	}
	return Options{Dir: h.dir, Confiner: conf}
}

// start runs a watcher with opts until the end of the test.
func (h *harness) start(t *testing.T, opts Options) *Watcher {
	t.Helper()
	w, stop := run(t, opts)
	t.Cleanup(stop)
	h.w = w
	return w
}

// run starts a watcher and returns a function that stops it and waits.
func run(t *testing.T, opts Options) (*Watcher, func()) {
	t.Helper()
	w, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	return w, func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(testutil.Deadline):
			t.Error("Run did not return after cancel")
		}
	}
}

func (h *harness) path(rel string) string { return filepath.Join(h.dir, rel) }

type sub struct {
	snapshot []Event
	synced   Synced
	s        *stream.Subscription[Event]
}

func (h *harness) subscribe(t *testing.T) *sub {
	t.Helper()
	snap, synced, s, err := h.w.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &sub{snapshot: snap, synced: synced, s: s}
}

// next returns the next live event (the snapshot is in s.snapshot).
func (s *sub) next(t *testing.T) Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	defer cancel()
	for {
		ev, err := s.s.Next(ctx)
		if err != nil {
			t.Fatalf("no event: %v", err)
		}
		if !ev.Snapshot {
			return ev
		}
	}
}

// pending returns the live events already queued for s, without waiting.
func (s *sub) pending() []Event {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out []Event
	for {
		ev, err := s.s.Next(ctx)
		if err != nil {
			return out
		}
		if !ev.Snapshot {
			out = append(out, ev)
		}
	}
}

// barrier creates a fresh marker socket and returns every event received
// before the marker's CREATED. Events are handled in order, so once the
// marker shows up every earlier filesystem change has been processed.
func (h *harness) barrier(t *testing.T, s *sub) []Event {
	t.Helper()
	marker := h.path(fmt.Sprintf("zz-marker-%d.sock", h.markers.Add(1)))
	listen(t, marker)
	var before []Event
	for {
		ev := s.next(t)
		if ev.Path == marker && ev.Type == Created {
			return before
		}
		before = append(before, ev)
	}
}

// rel is an event reduced to what the table tests compare.
type rel struct {
	Type EventType
	Path string // relative to the watched directory
}

func (r rel) String() string { return r.Type.String() + " " + r.Path }

func (h *harness) rels(evs []Event) []rel {
	out := make([]rel, 0, len(evs))
	for _, ev := range evs {
		r, err := filepath.Rel(h.dir, ev.Path)
		if err != nil {
			r = ev.Path
		}
		out = append(out, rel{ev.Type, r})
	}
	return out
}

func sortRels(rs []rel) []rel {
	slices.SortFunc(rs, func(a, b rel) int {
		if c := strings.Compare(a.Path, b.Path); c != 0 {
			return c
		}
		return int(a.Type) - int(b.Type)
	})
	return rs
}

func listPaths(h *harness) []string {
	socks, _ := h.w.List()
	out := make([]string, 0, len(socks))
	for _, s := range socks {
		r, _ := filepath.Rel(h.dir, s.Path)
		out = append(out, r)
	}
	return out
}
