package app

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// TestSettler: memory is given back once a burst of allocations is over,
// not while it goes on, not for a small one, and not twice within the
// interval.
func TestSettler(t *testing.T) {
	const mib = 1 << 20
	cfg := Settle{Burst: 16 * mib, Quiet: mib / 2, Period: time.Second, Interval: 10 * time.Second}.withDefaults()
	s := &settler{cfg: cfg}
	t0 := time.Unix(1000, 0)
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	var allocs uint64 = 100 * mib
	step := func(sec int, add uint64) bool {
		allocs += add
		return s.tick(at(sec), allocs)
	}
	if s.tick(at(0), allocs) {
		t.Fatal("gave back on the first sample")
	}
	// A burst: 8 MiB a second for 4 s. Never while it goes on.
	for sec := 1; sec <= 4; sec++ {
		if step(sec, 8*mib) {
			t.Fatalf("gave back during the burst, at %d s", sec)
		}
	}
	// Quiet: the next sample gives back, once.
	if !step(5, 100<<10) {
		t.Fatal("did not give back once the burst was over")
	}
	if step(6, 0) || step(7, 0) {
		t.Fatal("gave back again with nothing new allocated")
	}
	// A small burst (4 MiB) is not worth it.
	if step(8, 4*mib) || step(9, 0) {
		t.Fatal("gave back after a small burst")
	}
	// A second big burst soon after the first waits for the interval.
	step(10, 10*mib)
	step(11, 10*mib)
	if step(12, 0) {
		t.Fatal("gave back within the interval of the last give-back")
	}
	if step(14, 0) {
		t.Fatal("gave back within the interval of the last give-back")
	}
	if !step(15, 0) {
		t.Fatal("did not give back once the interval had passed")
	}
	// Steady allocation just above the quiet mark never counts as over.
	for sec := 30; sec < 60; sec++ {
		if step(sec, mib) {
			t.Fatalf("gave back during steady allocation, at %d s", sec)
		}
	}
}

func TestSettleDefaults(t *testing.T) {
	d := Settle{}.withDefaults()
	if d.Burst != DefaultSettleBurst || d.Quiet != DefaultSettleQuiet || d.Period != DefaultSettlePeriod || d.Interval != DefaultSettleInterval {
		t.Fatalf("defaults %+v", d)
	}
}

var sink [][]byte

// TestRunGivesBackAfterABurst: a service with Settle gives memory back once
// a burst of allocations is over, and counts it.
func TestRunGivesBackAfterABurst(t *testing.T) {
	root := testutil.TempDir(t)
	cfg := Config{Binary: "test", RootDir: root, APISocket: layout.APISocket(root, "test"), LogLevel: "info", LogFormat: "text"}
	regc := make(chan prometheus.Gatherer, 1)
	svc := Service{Binary: "test", Settle: &Settle{Burst: 4 << 20, Quiet: 256 << 10, Period: 20 * time.Millisecond, Interval: time.Millisecond},
		Setup: func(_ context.Context, rt *Runtime) error {
			regc <- rt.Metrics
			return nil
		}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, svc, cfg, slog.New(slog.DiscardHandler)) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	reg := <-regc
	gives := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		v, _ := testutil.MetricValue(testutil.FindMetric(mfs, "nodeplug_memory_give_backs_total", nil))
		return v
	}
	before := gives()
	testutil.Eventually(t, "memory given back after a burst", func() error {
		if n := gives(); n > before {
			return nil
		}
		// A burst of 8 MiB, then nothing for a few samples: the quiet is
		// what the service waits for. (Repeated, since the service's
		// first sample may come after the first burst.)
		for range 64 {
			sink = append(sink, make([]byte, 128<<10))
		}
		sink = nil
		time.Sleep(5 * svc.Settle.Period)
		return fmt.Errorf("no give-back yet (%v)", before)
	})
}
