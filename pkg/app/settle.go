package app

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeplug/nodeplug/pkg/memory"
)

// Settle configures how a service gives the memory of a burst of work back
// to the OS once the burst is over. The Go runtime returns freed memory
// lazily and only after a garbage collection, which an idle service does
// not run: without this, the heap that a thousand registrations grew stays
// with the process long after they are done. A burst is seen in the heap's
// allocations, not in any domain event, so it needs nothing from the
// service. Zero fields take the defaults.
type Settle struct {
	// Burst is how many bytes the heap must have allocated since the last
	// give-back (default 16 MiB): less is not worth a collection.
	Burst uint64
	// Quiet is the most the heap may allocate in one Period for the burst
	// to be over (default 512 KiB).
	Quiet uint64
	// Period is how often allocation is sampled (default 1 s).
	Period time.Duration
	// Interval is the least time between two give-backs (default 10 s).
	Interval time.Duration
	// Hook, when set, runs before each give-back: the service's own part
	// of it, dropping what it holds beyond what it needs now (see
	// memory.Giver).
	Hook func()
}

// Defaults of Settle.
const (
	DefaultSettleBurst    = 16 << 20
	DefaultSettleQuiet    = 512 << 10
	DefaultSettlePeriod   = time.Second
	DefaultSettleInterval = 10 * time.Second
)

func (s Settle) withDefaults() Settle {
	if s.Burst == 0 {
		s.Burst = DefaultSettleBurst
	}
	if s.Quiet == 0 {
		s.Quiet = DefaultSettleQuiet
	}
	if s.Period <= 0 {
		s.Period = DefaultSettlePeriod
	}
	if s.Interval <= 0 {
		s.Interval = DefaultSettleInterval
	}
	return s
}

// settler decides, from samples of the heap's cumulative allocations, when
// a burst is over. It keeps no clock and reads nothing itself: tick gets
// the time and the sample, so that a test can drive it.
type settler struct {
	cfg      Settle
	started  bool
	given    uint64    // allocations at the last give-back (or the first sample)
	prev     uint64    // allocations at the previous sample
	lastGive time.Time // zero before the first give-back
}

// tick takes the sample allocs (bytes allocated since the process
// started) at now and reports whether memory should be given back now:
// at least Burst allocated since the last give-back, less than Quiet since
// the previous sample, and Interval since the last give-back.
func (s *settler) tick(now time.Time, allocs uint64) bool {
	if !s.started {
		s.started, s.given, s.prev = true, allocs, allocs
		return false
	}
	quiet := allocs-s.prev < s.cfg.Quiet
	s.prev = allocs
	if allocs-s.given < s.cfg.Burst || !quiet {
		return false
	}
	if !s.lastGive.IsZero() && now.Sub(s.lastGive) < s.cfg.Interval {
		return false
	}
	s.given, s.lastGive = allocs, now
	return true
}

// SettleLoop samples the heap every Period until ctx ends, and gives the
// memory back (memory.Giver: the hook, a collection, then every free page
// returned, counted and logged) when the settler says a burst is over. A
// Service with Settle runs it; log and reg may be nil.
func SettleLoop(ctx context.Context, cfg Settle, log *slog.Logger, reg prometheus.Registerer) {
	cfg = cfg.withDefaults()
	g := memory.NewGiver(memory.GiverOptions{Hook: cfg.Hook, Metrics: "nodeplug_memory", Burst: "work", Registerer: reg, Log: log})
	s := &settler{cfg: cfg}
	t := time.NewTicker(cfg.Period)
	defer t.Stop()
	for {
		if s.tick(time.Now(), memory.HeapAllocs()) {
			g.Give()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
