package memory

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Giver is nodeplug's one way of giving the memory of a burst of work back
// to the OS. A service decides when its burst is over (pkg/app's Settle
// samples the heap; the devicemanager counts its endpoint changes) and
// calls Give; Give runs the service's hook, which shrinks what the service
// holds (a Go map never shrinks: the devicemanager rebuilds its maps),
// then Release, and counts and logs what was returned. A Giver is safe for
// concurrent use if its hook is.
type Giver struct {
	hook    func()
	release func() (before, after uint64)
	log     *slog.Logger
	gives   prometheus.Counter
	given   prometheus.Counter
}

// GiverOptions configure a Giver.
type GiverOptions struct {
	// Hook, when set, runs before each give-back, to drop what the service
	// holds beyond what it needs now.
	Hook func()
	// Metrics is the prefix of the metric names: <Metrics>_give_backs_total
	// and <Metrics>_given_back_bytes_total (e.g. "nodeplug_memory").
	Metrics string
	// Burst says in the metrics' help what a burst is of ("work").
	Burst string
	// Registerer receives the metrics; nil means none are registered.
	Registerer prometheus.Registerer
	Log        *slog.Logger
	// Release replaces memory.Release (tests).
	Release func() (before, after uint64)
}

// NewGiver returns a Giver.
func NewGiver(o GiverOptions) *Giver {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Release == nil {
		o.Release = Release
	}
	g := &Giver{
		hook: o.Hook, release: o.Release, log: o.Log,
		gives: prometheus.NewCounter(prometheus.CounterOpts{
			Name: o.Metrics + "_give_backs_total",
			Help: "Times garbage was collected and free memory returned to the OS after a burst of " + o.Burst + " was over.",
		}),
		given: prometheus.NewCounter(prometheus.CounterOpts{
			Name: o.Metrics + "_given_back_bytes_total",
			Help: "Bytes of memory returned to the OS after bursts of " + o.Burst + " were over.",
		}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(g.gives, g.given)
	}
	return g
}

// Give runs the hook, then Release, and counts and logs (at debug, with
// attrs) the memory returned.
func (g *Giver) Give(attrs ...any) {
	start := time.Now()
	if g.hook != nil {
		g.hook()
	}
	before, after := g.release()
	var returned uint64
	if before > after {
		returned = before - after
	}
	g.gives.Inc()
	g.given.Add(float64(returned))
	g.log.Debug("a burst is over: memory returned to the OS",
		append(attrs, "returned_bytes", returned, "retained_bytes", after, "took", time.Since(start))...)
}
