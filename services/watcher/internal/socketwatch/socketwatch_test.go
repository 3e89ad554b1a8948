package socketwatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sys/unix"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// TestWhatCounts drives the watcher through the filesystem changes the
// watcher-events contract names and compares the snapshot and the live
// events (order-insensitive within one step) with what it says.
func TestWhatCounts(t *testing.T) {
	c, d := Created, Deleted
	tests := []struct {
		name     string
		before   func(t *testing.T, h *harness) // before the watcher starts
		act      func(t *testing.T, h *harness) // after subscribing
		snapshot []string
		want     []rel
	}{
		{
			name: "socket at top level",
			act:  func(t *testing.T, h *harness) { listen(t, h.path("a.sock")) },
			want: []rel{{c, "a.sock"}},
		},
		{
			name: "sockets present at start, top level and nested",
			before: func(t *testing.T, h *harness) {
				listen(t, h.path("a.sock"))
				mkdir(t, h.path("x/y"))
				listen(t, h.path("x/y/b.sock"))
			},
			snapshot: []string{"a.sock", "x/y/b.sock"},
		},
		{
			name:   "socket in a nested directory that existed at start",
			before: func(t *testing.T, h *harness) { mkdir(t, h.path("x/y")) },
			act:    func(t *testing.T, h *harness) { listen(t, h.path("x/y/c.sock")) },
			want:   []rel{{c, "x/y/c.sock"}},
		},
		{
			name: "socket in a new directory",
			act: func(t *testing.T, h *harness) {
				mkdir(t, h.path("n"))
				listen(t, h.path("n/s.sock"))
			},
			want: []rel{{c, "n/s.sock"}},
		},
		{
			name: "new directory tree with a socket inside before its watch can be added",
			act: func(t *testing.T, h *harness) {
				for i := range 5 {
					p := h.path(fmt.Sprintf("t%d/a/b", i))
					mkdir(t, p)
					listen(t, filepath.Join(p, "s.sock"))
				}
			},
			want: []rel{{c, "t0/a/b/s.sock"}, {c, "t1/a/b/s.sock"}, {c, "t2/a/b/s.sock"}, {c, "t3/a/b/s.sock"}, {c, "t4/a/b/s.sock"}},
		},
		{
			name:   "hidden files, at start and later",
			before: func(t *testing.T, h *harness) { listen(t, h.path(".early.sock")) },
			act: func(t *testing.T, h *harness) {
				listen(t, h.path(".late.sock"))
				mkdir(t, h.path("v"))
				listen(t, h.path("v/.late.sock"))
			},
		},
		{
			name: "hidden directories, at start and later",
			before: func(t *testing.T, h *harness) {
				mkdir(t, h.path(".early/sub"))
				listen(t, h.path(".early/s.sock"))
				listen(t, h.path(".early/sub/s.sock"))
				mkdir(t, h.path("v/.early"))
				listen(t, h.path("v/.early/s.sock"))
			},
			act: func(t *testing.T, h *harness) {
				listen(t, h.path(".early/s2.sock"))
				mkdir(t, h.path(".late/sub"))
				listen(t, h.path(".late/sub/s.sock"))
				mkdir(t, h.path("v/.late"))
				listen(t, h.path("v/.late/s.sock"))
			},
		},
		{
			name: "hidden directory renamed to a visible name",
			before: func(t *testing.T, h *harness) {
				mkdir(t, h.path(".staging"))
				listen(t, h.path(".staging/s.sock"))
			},
			act: func(t *testing.T, h *harness) {
				if err := os.Rename(h.path(".staging"), h.path("ready")); err != nil {
					t.Fatal(err)
				}
			},
			want: []rel{{c, "ready/s.sock"}},
		},
		{
			name: "regular files and FIFOs",
			before: func(t *testing.T, h *harness) {
				writeFile(t, h.path("early.sock"))
				mkfifo(t, h.path("early.fifo"))
			},
			act: func(t *testing.T, h *harness) {
				writeFile(t, h.path("late.sock"))
				mkfifo(t, h.path("late.fifo"))
				mkdir(t, h.path("dir.sock"))
			},
		},
		{
			name: "symlinks: to a socket inside the allowed directories counts",
			before: func(t *testing.T, h *harness) {
				mkdir(t, h.path(".targets"))
				listen(t, h.path(".targets/early.sock"))
				symlink(t, h.path(".targets/early.sock"), h.path("early-link.sock"))
			},
			act: func(t *testing.T, h *harness) {
				listen(t, h.path(".targets/late.sock"))
				symlink(t, h.path(".targets/late.sock"), h.path("late-link.sock"))
				symlink(t, "late-link.sock", h.path("relative-link.sock"))
			},
			snapshot: []string{"early-link.sock"},
			want:     []rel{{c, "late-link.sock"}, {c, "relative-link.sock"}},
		},
		{
			name: "symlinks: outside the allowed directories, dangling or to a directory are ignored",
			before: func(t *testing.T, h *harness) {
				listen(t, filepath.Join(h.outside, "early.sock"))
				symlink(t, filepath.Join(h.outside, "early.sock"), h.path("early-out.sock"))
			},
			act: func(t *testing.T, h *harness) {
				listen(t, filepath.Join(h.outside, "late.sock"))
				symlink(t, filepath.Join(h.outside, "late.sock"), h.path("late-out.sock"))
				symlink(t, h.path("missing.sock"), h.path("dangling.sock"))
				mkdir(t, h.path(".d"))
				symlink(t, h.path(".d"), h.path("dirlink"))
				listen(t, h.path(".d/s.sock")) // only reachable through the symlinked directory
			},
		},
		{
			name:   "socket removed",
			before: func(t *testing.T, h *harness) { listen(t, h.path("a.sock")) },
			act: func(t *testing.T, h *harness) {
				if err := os.Remove(h.path("a.sock")); err != nil {
					t.Fatal(err)
				}
			},
			snapshot: []string{"a.sock"},
			want:     []rel{{d, "a.sock"}},
		},
		{
			name:   "socket renamed away is deleted",
			before: func(t *testing.T, h *harness) { listen(t, h.path("a.sock")) },
			act: func(t *testing.T, h *harness) {
				if err := os.Rename(h.path("a.sock"), filepath.Join(h.outside, "a.sock")); err != nil {
					t.Fatal(err)
				}
			},
			snapshot: []string{"a.sock"},
			want:     []rel{{d, "a.sock"}},
		},
		{
			name:   "socket renamed to a hidden name is deleted",
			before: func(t *testing.T, h *harness) { listen(t, h.path("a.sock")) },
			act: func(t *testing.T, h *harness) {
				if err := os.Rename(h.path("a.sock"), h.path(".a.sock")); err != nil {
					t.Fatal(err)
				}
			},
			snapshot: []string{"a.sock"},
			want:     []rel{{d, "a.sock"}},
		},
		{
			name:   "socket renamed within the tree",
			before: func(t *testing.T, h *harness) { listen(t, h.path("a.sock")) },
			act: func(t *testing.T, h *harness) {
				if err := os.Rename(h.path("a.sock"), h.path("b.sock")); err != nil {
					t.Fatal(err)
				}
			},
			snapshot: []string{"a.sock"},
			want:     []rel{{d, "a.sock"}, {c, "b.sock"}},
		},
		{
			name: "directory removed: every socket under it is deleted",
			before: func(t *testing.T, h *harness) {
				mkdir(t, h.path("d/e"))
				listen(t, h.path("d/a.sock"))
				listen(t, h.path("d/e/b.sock"))
			},
			act: func(t *testing.T, h *harness) {
				if err := os.RemoveAll(h.path("d")); err != nil {
					t.Fatal(err)
				}
			},
			snapshot: []string{"d/a.sock", "d/e/b.sock"},
			want:     []rel{{d, "d/a.sock"}, {d, "d/e/b.sock"}},
		},
		{
			name: "directory renamed away: every socket under it is deleted",
			before: func(t *testing.T, h *harness) {
				mkdir(t, h.path("d/e"))
				listen(t, h.path("d/a.sock"))
				listen(t, h.path("d/e/b.sock"))
			},
			act: func(t *testing.T, h *harness) {
				if err := os.Rename(h.path("d"), filepath.Join(h.outside, "d")); err != nil {
					t.Fatal(err)
				}
				// Changes in the moved tree are no longer ours.
				listen(t, filepath.Join(h.outside, "d/e/c.sock"))
			},
			snapshot: []string{"d/a.sock", "d/e/b.sock"},
			want:     []rel{{d, "d/a.sock"}, {d, "d/e/b.sock"}},
		},
		{
			name: "directory moved within the tree keeps being watched",
			before: func(t *testing.T, h *harness) {
				mkdir(t, h.path("d/e"))
				listen(t, h.path("d/e/b.sock"))
			},
			act: func(t *testing.T, h *harness) {
				if err := os.Rename(h.path("d"), h.path("m")); err != nil {
					t.Fatal(err)
				}
				listen(t, h.path("m/e/c.sock"))
			},
			snapshot: []string{"d/e/b.sock"},
			want:     []rel{{d, "d/e/b.sock"}, {c, "m/e/b.sock"}, {c, "m/e/c.sock"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t)
			if tt.before != nil {
				tt.before(t, h)
			}
			h.start(t, h.options(t))
			s := h.subscribe(t)
			var snap []string
			for _, ev := range h.rels(s.snapshot) {
				snap = append(snap, ev.Path)
			}
			if !slices.Equal(snap, tt.snapshot) {
				t.Fatalf("snapshot = %q, want %q", snap, tt.snapshot)
			}
			if s.synced.SocketCount != len(tt.snapshot) {
				t.Fatalf("synced.SocketCount = %d, want %d", s.synced.SocketCount, len(tt.snapshot))
			}
			if tt.act != nil {
				tt.act(t, h)
			}
			got := sortRels(h.rels(h.barrier(t, s)))
			want := sortRels(slices.Clone(tt.want))
			if !slices.Equal(got, want) {
				t.Fatalf("live events = %v, want %v", got, want)
			}
			// The set agrees with the events.
			wantList := append([]string(nil), tt.snapshot...)
			for _, r := range tt.want {
				if r.Type == Created {
					wantList = append(wantList, r.Path)
				} else {
					wantList = slices.DeleteFunc(wantList, func(p string) bool { return p == r.Path })
				}
			}
			wantList = append(wantList, "zz-marker-1.sock")
			slices.Sort(wantList)
			if got := listPaths(h); !slices.Equal(got, wantList) {
				t.Fatalf("List = %q, want %q", got, wantList)
			}
		})
	}
}

func writeFile(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, link string) {
	t.Helper()
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
}

func TestEventFields(t *testing.T) {
	h := setup(t)
	listen(t, h.path("early.sock"))
	w := h.start(t, h.options(t))
	s := h.subscribe(t)
	if len(s.snapshot) != 1 {
		t.Fatalf("snapshot has %d events, want 1", len(s.snapshot))
	}
	snap := s.snapshot[0]
	if !snap.Snapshot || snap.Type != Created || snap.Path != h.path("early.sock") ||
		snap.Generation != testutil.Generation(t, h.path("early.sock")) || snap.TraceContext != nil ||
		snap.Revision != s.synced.Revision || snap.ObservedTime.IsZero() {
		t.Fatalf("snapshot event %+v (synced %+v)", snap, s.synced)
	}

	listen(t, h.path("late.sock"))
	ev := s.next(t)
	if ev.Snapshot || ev.Type != Created || ev.Path != h.path("late.sock") ||
		ev.Generation != testutil.Generation(t, h.path("late.sock")) || ev.ObservedTime.IsZero() {
		t.Fatalf("live event %+v", ev)
	}
	if ev.Revision != s.synced.Revision+1 {
		t.Fatalf("revision %d, want %d", ev.Revision, s.synced.Revision+1)
	}
	if err := os.Remove(h.path("late.sock")); err != nil {
		t.Fatal(err)
	}
	del := s.next(t)
	if del.Type != Deleted || del.Path != ev.Path || del.Generation != ev.Generation || del.Revision != ev.Revision+1 {
		t.Fatalf("delete event %+v after %+v", del, ev)
	}
	socks, rev := w.List()
	if rev != del.Revision || len(socks) != 1 || socks[0].Path != h.path("early.sock") || socks[0].ObservedTime != snap.ObservedTime {
		t.Fatalf("List = %+v at %d", socks, rev)
	}
	if w.InstanceID() == "" || w.Dir() != h.dir {
		t.Fatalf("instance %q dir %q", w.InstanceID(), w.Dir())
	}
}

func TestDeleteAndRecreateGetsNewGeneration(t *testing.T) {
	h := setup(t)
	h.start(t, h.options(t))
	s := h.subscribe(t)
	p := h.path("a.sock")
	var gens []string
	for range 5 {
		listen(t, p)
		created := s.next(t)
		if created.Type != Created || created.Path != p {
			t.Fatalf("got %+v, want CREATED %s", created, p)
		}
		if slices.Contains(gens, created.Generation) {
			t.Fatalf("generation %s repeats (inode reuse?): %v", created.Generation, gens)
		}
		gens = append(gens, created.Generation)
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		deleted := s.next(t)
		if deleted.Type != Deleted || deleted.Generation != created.Generation {
			t.Fatalf("got %+v, want DELETED of generation %s", deleted, created.Generation)
		}
	}
}

// TestRecreateWithLostRemove shows the rule for a known path that turns up
// with a new generation: DELETED(old), then CREATED(new).
func TestRecreateWithLostRemove(t *testing.T) {
	h := setup(t)
	p := h.path("a.sock")
	opts := h.options(t)
	opts.dropEvent = func(ev fsnotify.Event) bool { return ev.Has(fsnotify.Remove) }
	listen(t, p)
	h.start(t, opts)
	s := h.subscribe(t)
	old := s.snapshot[0].Generation
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	listen(t, p)
	got := h.barrier(t, s)
	if len(got) != 2 || got[0].Type != Deleted || got[0].Generation != old ||
		got[1].Type != Created || got[1].Generation != testutil.Generation(t, p) || got[1].Generation == old ||
		got[0].Path != p || got[1].Path != p || got[1].Revision != got[0].Revision+1 {
		t.Fatalf("events = %+v, want DELETED %s then CREATED with the new generation", got, old)
	}
}

func TestChmodChownKeepGeneration(t *testing.T) {
	h := setup(t)
	p := h.path("a.sock")
	listen(t, p)
	h.start(t, h.options(t))
	s := h.subscribe(t)
	gen := s.snapshot[0].Generation
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(p, os.Getuid(), os.Getgid()); err != nil {
		t.Fatal(err)
	}
	if os.Getuid() == 0 {
		if err := os.Lchown(p, 65534, 65534); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.barrier(t, s); len(got) != 0 {
		t.Fatalf("chmod/chown caused events: %+v", got)
	}
	if g := testutil.Generation(t, p); g != gen {
		t.Fatalf("generation changed from %s to %s", gen, g)
	}
	socks, _ := h.w.List()
	if socks[0].Path != p || socks[0].Generation != gen {
		t.Fatalf("List = %+v", socks)
	}
}

func TestRestartKeepsGenerations(t *testing.T) {
	h := setup(t)
	listen(t, h.path("a.sock"))
	mkdir(t, h.path("x"))
	listen(t, h.path("x/b.sock"))
	opts := h.options(t)

	w1, stop1 := run(t, opts)
	before, _ := w1.List()
	stop1()
	if _, _, _, err := w1.Subscribe(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Subscribe on a stopped watcher: %v, want ErrStopped", err)
	}
	w2, stop2 := run(t, opts)
	defer stop2()
	after, _ := w2.List()
	if len(before) != 2 || len(after) != 2 {
		t.Fatalf("before %+v after %+v", before, after)
	}
	for i := range before {
		if before[i].Path != after[i].Path || before[i].Generation != after[i].Generation {
			t.Fatalf("socket %d: before %+v, after restart %+v", i, before[i], after[i])
		}
	}
	if w1.InstanceID() == w2.InstanceID() {
		t.Fatal("instance ID did not change across restart")
	}
}

func TestStopEndsSubscriptions(t *testing.T) {
	h := setup(t)
	w, stop := run(t, h.options(t))
	_, _, sub, err := w.Subscribe()
	if err != nil {
		t.Fatal(err)
	}
	stop()
	for {
		if _, err = sub.Next(context.Background()); err != nil {
			break
		}
	}
	if !errors.Is(err, ErrStopped) || !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(sub.Err(), ErrStopped) {
		t.Fatalf("subscription ended with %v (Err %v), want ErrStopped", err, sub.Err())
	}
	sub.Close()
	err = w.Watch(context.Background(), func(Event) error { return nil }, func(Synced) error { return nil })
	if !errors.Is(err, ErrStopped) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Watch on a stopped watcher = %v, want ErrStopped", err)
	}
}

// TestManySubscribersOneStalled: a subscriber that stops reading is closed
// with RESOURCE_EXHAUSTED once its buffer is full; the others receive every
// event. The readers are paced (each socket is created once every reader has
// the previous one), so only the stalled subscriber can fall behind.
func TestManySubscribersOneStalled(t *testing.T) {
	const buffer, n, readers = 8, 30, 4
	h := setup(t)
	reg := prometheus.NewRegistry()
	opts := h.options(t)
	opts.Limits = stream.Limits{Items: buffer}
	opts.Registerer = reg
	w := h.start(t, opts)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	got := make([]chan string, readers)
	errs := make([]error, readers)
	synced := make(chan struct{}, readers+1)
	for i := range readers {
		got[i] = make(chan string, n)
		wg.Go(func() {
			count := 0
			errs[i] = w.Watch(ctx, func(ev Event) error {
				got[i] <- ev.Path
				if count++; count == n {
					return errDone
				}
				return nil
			}, func(Synced) error { synced <- struct{}{}; return nil })
		})
	}
	stalled := make(chan struct{})
	stalledErr := make(chan error, 1)
	var stalledGot int
	go func() {
		stalledErr <- w.Watch(ctx, func(Event) error {
			stalledGot++
			<-stalled // stops reading until released
			return nil
		}, func(Synced) error { synced <- struct{}{}; return nil })
	}()
	for range readers + 1 {
		<-synced
	}
	for i := range n {
		p := h.path(fmt.Sprintf("s%03d.sock", i))
		listen(t, p)
		for r := range readers {
			select {
			case path := <-got[r]:
				if path != p {
					t.Fatalf("reader %d got %s, want %s", r, path, p)
				}
			case <-time.After(testutil.Deadline):
				t.Fatalf("reader %d did not get %s", r, p)
			}
		}
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, errDone) {
			t.Fatalf("reader %d ended with %v", i, err)
		}
	}
	// The stalled subscriber was closed: its queue is gone, and it holds
	// only the event its send is blocked on, though its stream stays open
	// until that send returns ...
	if got := gauge(t, reg, "nodeplug_watcher_subscriber_bytes"); got <= 0 || got > 1024 {
		t.Fatalf("subscriber bytes gauge = %v, want the one event being sent", got)
	}
	// ... and, once it reads again, learns why.
	close(stalled)
	err := <-stalledErr
	if !errors.Is(err, stream.ErrSlow) || !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("stalled subscriber ended with %v, want stream.ErrSlow", err)
	}
	if stalledGot > 1 {
		t.Fatalf("stalled subscriber received %d events; its queue was not dropped", stalledGot)
	}
	if got := counter(t, reg, "nodeplug_watcher_slow_subscribers_dropped_total", nil); got != 1 {
		t.Fatalf("dropped counter = %v, want 1", got)
	}
	if got := gauge(t, reg, "nodeplug_watcher_subscribers"); got != 0 {
		t.Fatalf("subscribers gauge = %v, want 0", got)
	}
}

var errDone = errors.New("received everything")

// TestBurstOfSockets creates 1,000 sockets at once, from several goroutines
// and in several directories, and checks that none is missed.
func TestBurstOfSockets(t *testing.T) {
	const n, workers = 1000, 8
	h := setup(t)
	for i := range workers {
		mkdir(t, h.path(fmt.Sprintf("w%d", i)))
	}
	h.start(t, h.options(t))
	s := h.subscribe(t)
	want := map[string]bool{}
	for i := range n {
		want[h.path(fmt.Sprintf("w%d/s%04d.sock", i%workers, i))] = true
	}
	var wg sync.WaitGroup
	for wk := range workers {
		wg.Go(func() {
			for i := wk; i < n; i += workers {
				// Stale sockets need no open descriptors, however many.
				// t.Fatal may not be called here, off the test's goroutine.
				if err := stack.StaleSocket(h.path(fmt.Sprintf("w%d/s%04d.sock", wk, i)), true); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for len(seen) < n {
		ev := s.next(t)
		if ev.Type != Created || !want[ev.Path] || seen[ev.Path] {
			t.Fatalf("unexpected event %+v after %d sockets", ev, len(seen))
		}
		seen[ev.Path] = true
	}
	if extra := h.barrier(t, s); len(extra) != 0 {
		t.Fatalf("extra events after the burst: %+v", extra)
	}
	socks, _ := h.w.List()
	if len(socks) != n+1 { // + the barrier's marker
		t.Fatalf("List has %d sockets, want %d", len(socks), n+1)
	}
	for _, sk := range socks {
		if !want[sk.Path] && !strings.Contains(sk.Path, "zz-marker") {
			t.Fatalf("List has unexpected %s", sk.Path)
		}
	}
}

// TestOverflowRescan loses every fsnotify event (as an overflowing queue
// does) and injects fsnotify's overflow error: the rescan must emit exactly
// the differences.
func TestOverflowRescan(t *testing.T) {
	h := setup(t)
	reg := prometheus.NewRegistry()
	errs := make(chan error)
	opts := h.options(t)
	opts.Registerer = reg
	opts.injectErrors = errs
	opts.dropEvent = func(fsnotify.Event) bool { return true }
	opts.TracerProvider = testTracerProvider(t)
	listen(t, h.path("kept.sock"))
	listen(t, h.path("gone.sock"))
	listen(t, h.path("recreated.sock"))
	mkdir(t, h.path("olddir"))
	listen(t, h.path("olddir/x.sock"))
	h.start(t, opts)
	s := h.subscribe(t)
	gens := map[string]string{}
	for _, ev := range s.snapshot {
		gens[ev.Path] = ev.Generation
	}

	for _, p := range []string{"gone.sock", "recreated.sock"} {
		if err := os.Remove(h.path(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.RemoveAll(h.path("olddir")); err != nil {
		t.Fatal(err)
	}
	listen(t, h.path("recreated.sock"))
	listen(t, h.path("new.sock"))
	mkdir(t, h.path("newdir/sub"))
	listen(t, h.path("newdir/sub/y.sock"))
	listen(t, h.path(".hidden.sock"))

	errs <- fmt.Errorf("reading events: %w", fsnotify.ErrEventOverflow)
	var got []Event
	for len(got) < 6 {
		got = append(got, s.next(t))
	}
	want := []rel{
		{Deleted, "gone.sock"}, {Deleted, "olddir/x.sock"}, {Deleted, "recreated.sock"},
		{Created, "new.sock"}, {Created, "newdir/sub/y.sock"}, {Created, "recreated.sock"},
	}
	if r := h.rels(got); !slices.Equal(r, want) {
		t.Fatalf("rescan emitted %v, want %v", r, want)
	}
	for _, ev := range got {
		if ev.Type == Deleted && ev.Generation != gens[ev.Path] {
			t.Fatalf("DELETED %s with generation %s, want %s", ev.Path, ev.Generation, gens[ev.Path])
		}
		if ev.Type == Created && ev.Generation != testutil.Generation(t, ev.Path) {
			t.Fatalf("CREATED %s with a stale generation", ev.Path)
		}
		if ev.TraceContext["traceparent"] == "" {
			t.Fatalf("rescan event without trace context: %+v", ev)
		}
	}
	// A second overflow with nothing changed emits nothing.
	errs <- fsnotify.ErrEventOverflow
	errs <- errors.New("some other fsnotify error") // logged only
	if got := counter(t, reg, "nodeplug_watcher_rescans_total", nil); got != 2 {
		t.Fatalf("rescans = %v, want 2", got)
	}
	paths := listPaths(h)
	wantPaths := []string{"kept.sock", "new.sock", "newdir/sub/y.sock", "recreated.sock"}
	if !slices.Equal(paths, wantPaths) {
		t.Fatalf("List = %q, want %q", paths, wantPaths)
	}
	// The second rescan ran to its end before errs took the next error,
	// so whatever it emitted is queued by now.
	if evs := s.pending(); len(evs) != 0 {
		t.Fatalf("unexpected events after an unchanged rescan: %+v", evs)
	}
}

// TestLongPaths: sockets whose paths are at the 107-byte limit, in existing
// and new directories.
func TestLongPaths(t *testing.T) {
	h := setup(t)
	h.start(t, h.options(t))
	s := h.subscribe(t)
	pad := func(dir, suffix string) string {
		n := unixsock.MaxPathLen - len(dir) - 1 - len(suffix)
		if n < 1 {
			t.Skipf("temp dir %s too long for this test", dir)
		}
		return filepath.Join(dir, strings.Repeat("p", n)+suffix)
	}
	top := pad(h.dir, ".sock")
	deepDir := h.path("a-new-directory/with-a-nested-one")
	mkdir(t, deepDir)
	deep := pad(deepDir, ".sock")
	for _, p := range []string{top, deep} {
		if len(p) != unixsock.MaxPathLen {
			t.Fatalf("test path is %d bytes", len(p))
		}
		listen(t, p)
		ev := s.next(t)
		if ev.Type != Created || ev.Path != p || ev.Generation != testutil.Generation(t, p) {
			t.Fatalf("got %+v, want CREATED %s", ev, p)
		}
	}
	if err := os.Remove(top); err != nil {
		t.Fatal(err)
	}
	if ev := s.next(t); ev.Type != Deleted || ev.Path != top {
		t.Fatalf("got %+v, want DELETED %s", ev, top)
	}
}

// TestTraceContext: each live event carries the context of a new root span
// (not a child of whatever the caller had), ended at once; snapshot events
// carry none.
func TestTraceContext(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	h := setup(t)
	listen(t, h.path("early.sock"))
	opts := h.options(t)
	opts.TracerProvider = tp
	h.start(t, opts)
	s := h.subscribe(t)
	if s.snapshot[0].TraceContext != nil {
		t.Fatalf("snapshot event has trace context %v", s.snapshot[0].TraceContext)
	}
	listen(t, h.path("a.sock"))
	created := s.next(t)
	if err := os.Remove(h.path("a.sock")); err != nil {
		t.Fatal(err)
	}
	deleted := s.next(t)

	ended := rec.Ended()
	if len(ended) != 2 {
		t.Fatalf("%d spans ended, want 2 (none for the initial walk)", len(ended))
	}
	for i, tc := range []struct {
		ev   Event
		name string
	}{{created, "watcher.socket_created"}, {deleted, "watcher.socket_deleted"}} {
		span := ended[i]
		sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), tc.ev.TraceContext))
		if !sc.IsValid() || sc.TraceID() != span.SpanContext().TraceID() || sc.SpanID() != span.SpanContext().SpanID() {
			t.Fatalf("event %+v carries %v, want span %v", tc.ev, sc, span.SpanContext())
		}
		if span.Name() != tc.name || span.Parent().IsValid() {
			t.Fatalf("span %q parent %v, want root %q", span.Name(), span.Parent(), tc.name)
		}
		attrs := map[string]string{}
		for _, kv := range span.Attributes() {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		if attrs["socket.path"] != tc.ev.Path || attrs["socket.generation"] != tc.ev.Generation ||
			attrs["revision"] != fmt.Sprint(tc.ev.Revision) || attrs["watcher.cause"] != "fsnotify" {
			t.Fatalf("span attributes %v for event %+v", attrs, tc.ev)
		}
	}
	if ended[0].SpanContext().TraceID() == ended[1].SpanContext().TraceID() {
		t.Fatal("two events share a trace")
	}
}

func TestMetrics(t *testing.T) {
	h := setup(t)
	reg := prometheus.NewRegistry()
	listen(t, h.path("early.sock"))
	opts := h.options(t)
	opts.Registerer = reg
	h.start(t, opts)
	s := h.subscribe(t)
	// One change at a time: a socket removed before its Create is handled
	// is never seen.
	listen(t, h.path("a.sock"))
	s.next(t)
	listen(t, h.path("b.sock"))
	s.next(t)
	if err := os.Remove(h.path("a.sock")); err != nil {
		t.Fatal(err)
	}
	s.next(t)
	// The initial walk counts as events too (nobody could see them live,
	// but they are changes of the set).
	if got := counter(t, reg, "nodeplug_watcher_events_total", map[string]string{"type": "created"}); got != 3 {
		t.Fatalf("created = %v, want 3", got)
	}
	if got := counter(t, reg, "nodeplug_watcher_events_total", map[string]string{"type": "deleted"}); got != 1 {
		t.Fatalf("deleted = %v, want 1", got)
	}
	if got := gauge(t, reg, "nodeplug_watcher_sockets"); got != 2 {
		t.Fatalf("sockets = %v, want 2", got)
	}
	if got := gauge(t, reg, "nodeplug_watcher_subscribers"); got != 1 {
		t.Fatalf("subscribers = %v, want 1", got)
	}
}

// TestPluginDirectoryRemoved: when the watched directory itself goes, its
// sockets are deleted, and the directory is recreated and watched again.
func TestPluginDirectoryRemoved(t *testing.T) {
	h := setup(t)
	mkdir(t, h.path("x"))
	listen(t, h.path("x/a.sock"))
	h.start(t, h.options(t))
	s := h.subscribe(t)
	if err := os.RemoveAll(h.dir); err != nil {
		t.Fatal(err)
	}
	if ev := s.next(t); ev.Type != Deleted || ev.Path != h.path("x/a.sock") {
		t.Fatalf("got %+v, want DELETED x/a.sock", ev)
	}
	// The watcher recreates the directory; wait for it, then use it.
	testutil.WaitFor(t, "the plugin directory recreated", func() bool {
		fi, err := os.Stat(h.dir)
		return err == nil && fi.IsDir()
	})
	if got := h.barrier(t, s); len(got) != 0 {
		t.Fatalf("unexpected events %+v", got)
	}
}

func TestNewRejectsBadDirectories(t *testing.T) {
	base := testutil.TempDir(t)
	file := filepath.Join(base, "file")
	writeFile(t, file)
	for _, tc := range []struct {
		name string
		dir  string
	}{
		{"relative", "plugins_registry"},
		{"a file", file},
		{"below a file", filepath.Join(file, "plugins_registry")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if w, err := New(Options{Dir: tc.dir}); err == nil {
				w.Close()
				t.Fatalf("New(%q) succeeded", tc.dir)
			}
		})
	}
	// A missing directory is created with mode 0750.
	dir := filepath.Join(base, "root", "plugins_registry")
	w, err := New(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&^0o750 != 0 {
		t.Fatalf("created directory: %v %v", fi, err)
	}
}

func TestHidden(t *testing.T) {
	w := &Watcher{dir: "/r/plugins_registry"}
	for _, tc := range []struct {
		path string
		want bool
	}{
		{"/r/plugins_registry", false},
		{"/r/plugins_registry/a.sock", false},
		{"/r/plugins_registry/d/a.sock", false},
		{"/r/plugins_registry/a.b.sock", false},
		{"/r/plugins_registry/.a.sock", true},
		{"/r/plugins_registry/.d/a.sock", true},
		{"/r/plugins_registry/d/.e/a.sock", true},
		{"/r/plugins_registry/..x.sock", true},
		{"/r/other/a.sock", true},
		{"/r/plugins_registry2/a.sock", true},
	} {
		if got := w.hidden(tc.path); got != tc.want {
			t.Errorf("hidden(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
	// Only components below the watched directory count.
	hw := &Watcher{dir: "/r/.kube/plugins_registry"}
	if hw.hidden("/r/.kube/plugins_registry/a.sock") {
		t.Error("a hidden component above the watched directory hides everything")
	}
}

func testTracerProvider(t *testing.T) *sdktrace.TracerProvider {
	t.Helper()
	tp := sdktrace.NewTracerProvider()
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	m := find(t, reg, name, labels)
	if m == nil {
		return 0
	}
	return m.GetCounter().GetValue()
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	m := find(t, reg, name, nil)
	if m == nil {
		t.Fatalf("metric %s not found", name)
	}
	return m.GetGauge().GetValue()
}

func find(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return testutil.FindMetric(mfs, name, labels)
}

// TestHandleEvent feeds events straight to the handler (no Run loop, so the
// outcome of each is known when the call returns), for the cases the kernel
// produces only in races: a duplicate Create, a Create for a path already
// gone, events for paths that do not count.
func TestHandleEvent(t *testing.T) {
	h := setup(t)
	known := h.path("known.sock")
	listen(t, known)
	gone := h.path("gone.sock")
	listen(t, gone)
	w, err := New(h.options(t))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	h.w = w
	s := h.subscribe(t)
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	listen(t, h.path(".hidden.sock"))
	listen(t, filepath.Join(h.outside, "out.sock"))

	for _, tc := range []struct {
		name string
		ev   fsnotify.Event
		want []rel
	}{
		{"duplicate Create, same generation", fsnotify.Event{Name: known, Op: fsnotify.Create}, nil},
		{"Write", fsnotify.Event{Name: known, Op: fsnotify.Write}, nil},
		{"Chmod", fsnotify.Event{Name: known, Op: fsnotify.Chmod}, nil},
		{"Create for a path already gone", fsnotify.Event{Name: gone, Op: fsnotify.Create}, []rel{{Deleted, "gone.sock"}}},
		{"Remove of an unknown path", fsnotify.Event{Name: h.path("never.sock"), Op: fsnotify.Remove}, nil},
		{"Create of a hidden socket", fsnotify.Event{Name: h.path(".hidden.sock"), Op: fsnotify.Create}, nil},
		{"Create outside the directory", fsnotify.Event{Name: filepath.Join(h.outside, "out.sock"), Op: fsnotify.Create}, nil},
		{"Create of the directory itself", fsnotify.Event{Name: h.dir, Op: fsnotify.Create}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w.handleEvent(tc.ev)
			if r := h.rels(s.pending()); !slices.Equal(r, tc.want) {
				t.Fatalf("events %v, want %v", r, tc.want)
			}
		})
	}
	if got := listPaths(h); !slices.Equal(got, []string{"known.sock"}) {
		t.Fatalf("List = %q", got)
	}
}
