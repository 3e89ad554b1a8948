package bench

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
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
	// A CPU profile is a gzipped protobuf; what pprof reads of it is
	// the profiler's, not this test's to check.
	f, err := os.Open(prof)
	if err != nil {
		t.Fatalf("no profile written: %v", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("the profile is not gzipped: %v", err)
	}
	data, err := io.ReadAll(zr)
	if err != nil || len(data) == 0 {
		t.Fatalf("the profile is empty or damaged: %d bytes, %v", len(data), err)
	}
}
