package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRoundAppearsOnceAllListen: a round calls its appear hook once every
// plugin of the fleet listens in staging and before any of them is in the
// watched directory (the kubelet's rounds wait there for their moment in
// its reconciler period); the round then measures from the renames. A
// hook's error ends the round with it, before anything appears.
func TestRoundAppearsOnceAllListen(t *testing.T) {
	const n = 5
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := &runner{root: t.TempDir()}
	dir := filepath.Join(r.root, "floor")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	f, err := newFloorRegistrar(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = f.Close()
		}
	}()

	calls := 0
	appear := func() error {
		calls++
		if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
			return fmt.Errorf("before the plugins appear, the directory holds %d entries (%v)", len(entries), err)
		}
		staged, err := filepath.Glob(filepath.Join(r.root, "staging-r*", "*.sock"))
		if err != nil || len(staged) != n {
			return fmt.Errorf("staged sockets %v (%v), want %d", staged, err, n)
		}
		for _, p := range staged {
			c, err := net.Dial("unix", p)
			if err != nil {
				return fmt.Errorf("staged plugin %s does not listen: %w", p, err)
			}
			_ = c.Close()
		}
		return nil
	}
	figs, err := r.round(ctx, KindDRA, n, dir, appear, func() error { closed = true; return f.Close() })
	if err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Fatalf("appear called %d times, want once", calls)
	}
	if figs.Notify.Count != n {
		t.Fatalf("round measured %d registrations, want %d", figs.Notify.Count, n)
	}

	// A hook that fails ends the round with its error; nothing appeared.
	late := errors.New("the moment never came")
	if _, err := r.round(ctx, KindDRA, n, dir, func() error { return late }, nil); !errors.Is(err, late) {
		t.Fatalf("round with a failing hook: %v, want %v", err, late)
	}
	if entries, err := os.ReadDir(dir); err != nil || len(entries) != 0 {
		t.Fatalf("after a failed hook the directory holds %d entries (%v)", len(entries), err)
	}
}
