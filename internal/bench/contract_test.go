package bench

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/memory"
)

// TestContractFloorProfile runs one contract floor process with
// ContractPprofEnv set, as the bench does with -pprof: once it stops, the
// file holds a CPU profile of its life.
func TestContractFloorProfile(t *testing.T) {
	dir := testutil.TempDir(t)
	prof := filepath.Join(dir, "contract-watcher.cpu.pprof")
	t.Setenv(ContractPprofEnv, prof)
	watched, socket := filepath.Join(dir, "plugins"), filepath.Join(dir, "w.sock")
	if err := os.Mkdir(watched, 0o750); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- ContractFloor(ctx, "watcher", []string{watched, socket}, nil) }()
	testutil.Eventually(t, "the contract floor watcher listens", func() error {
		select {
		case err := <-done:
			t.Fatalf("the contract floor watcher ended before it listened: %v", err)
		default:
		}
		if _, err := os.Stat(socket); err != nil {
			return err
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("contract floor watcher: %v", err)
	}
	checkProfile(t, prof)
}

// TestFloorProfiles runs the floor phase with -pprof, as one would to
// compare the services with the contract floor: each of the contract
// floor's processes and each service leaves a CPU profile.
func TestFloorProfiles(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the services")
	}
	bin := binaries(t)
	dir := testutil.TempDir(t)
	profiles := filepath.Join(dir, "pprof")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "nodeplug-bench"), "-phases", "floor", "-kinds", kindSlug(KindDRA),
		"-registration-n", "1", "-floor-rounds", "1", "-kubelet-harness", "off", "-json", "", "-baseline", "",
		"-root-dir", filepath.Join(dir, "root"), "-pprof", profiles, "-pprof-seconds", "1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("nodeplug-bench -phases floor -pprof: %v\n%s", err, out)
	}
	for _, name := range []string{"contract-watcher", "contract-reconciler", "contract-devicemanager", "floor-alone"} {
		checkProfile(t, filepath.Join(profiles, name+".cpu.pprof"))
	}
	for _, s := range stack.Services {
		checkProfile(t, filepath.Join(profiles, s+".cpu.pprof"))
	}
}

// checkProfile fails t unless path holds a CPU profile as pprof writes
// one: a gzipped protobuf (what pprof reads of it is the profiler's, not
// these tests', to check).
func checkProfile(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("no profile written: %v", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s is not gzipped: %v", path, err)
	}
	data, err := io.ReadAll(zr)
	if err != nil || len(data) == 0 {
		t.Fatalf("%s is empty or damaged: %d bytes, %v", path, len(data), err)
	}
}

// TestContractGiveBack: the contract floor's devicemanager gives memory
// back by nodeplug's devicemanager's rule: not for fewer than 64 endpoint
// changes; a second after the 64th; the next burst not sooner than 10 s
// after that give-back.
func TestContractGiveBack(t *testing.T) {
	rule := memory.BurstRule{}.WithDefaults()
	released := make(chan time.Time, 4)
	g := newContractGiveBack()
	g.release = func() (uint64, uint64) { released <- time.Now(); return 0, 0 }
	defer g.stop()
	for range rule.MinChanges - 1 {
		g.changed()
	}
	g.mu.Lock()
	armed := g.timer != nil
	g.mu.Unlock()
	if armed {
		t.Fatalf("a give-back is due after %d changes", rule.MinChanges-1)
	}
	before := time.Now()
	g.changed()
	var given time.Time
	select {
	case given = <-released:
	case <-time.After(time.Minute):
		t.Fatalf("no give-back a minute after a burst of %d changes", rule.MinChanges)
	}
	if waited := given.Sub(before); waited < rule.Quiet {
		t.Fatalf("given back %v after the last change, before the burst was quiet for %v", waited, rule.Quiet)
	}
	g.mu.Lock()
	_, pending := g.burst.Due()
	g.mu.Unlock()
	if pending {
		t.Fatal("a burst still pending after the give-back")
	}
	for range rule.MinChanges {
		g.changed()
	}
	g.mu.Lock()
	due, _ := g.burst.Due()
	armed = g.timer != nil
	g.mu.Unlock()
	// The give-back counted itself given after before, so the next one is
	// due no sooner than Interval after before.
	if !armed || due.Before(before.Add(rule.Interval)) {
		t.Fatalf("next give-back armed %v, due %v: want it no sooner than %v after the last (about %v)", armed, due, rule.Interval, given)
	}
}
