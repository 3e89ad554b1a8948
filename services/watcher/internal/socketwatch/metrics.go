package socketwatch

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeplug/nodeplug/pkg/stream"
)

type metrics struct {
	events  *prometheus.CounterVec
	sockets prometheus.Gauge
	rescans prometheus.Counter
	refused prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, hub func() stream.Stats) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_watcher_events_total",
			Help: "Changes to the socket set, by type (created, deleted), including the sockets found at start; snapshot entries sent to subscribers are not counted.",
		}, []string{"type"}),
		sockets: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodeplug_watcher_sockets",
			Help: "Plugin sockets currently present under the plugin directory.",
		}),
		rescans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeplug_watcher_rescans_total",
			Help: "Full rescans of the plugin directory after an fsnotify queue overflow or the loss of the directory.",
		}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeplug_watcher_subscribers_refused_total",
			Help: "WatchSocketEvents streams refused with RESOURCE_EXHAUSTED: as many as the limit were open, or the snapshot did not fit in the bytes left.",
		}),
	}
	// Both label values exist from the start, so rates work before the
	// first event.
	m.events.WithLabelValues(Created.String())
	m.events.WithLabelValues(Deleted.String())
	if reg != nil {
		reg.MustRegister(m.events, m.sockets, m.rescans, m.refused,
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "nodeplug_watcher_slow_subscribers_dropped_total",
				Help: "Subscribers closed with RESOURCE_EXHAUSTED because they fell behind, or held the most when the subscribers together held their byte budget. Counted when closed; the client learns it when it reads again.",
			}, func() float64 { return float64(hub().Closed) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "nodeplug_watcher_subscribers",
				Help: "Open WatchSocketEvents subscriptions.",
			}, func() float64 { return float64(hub().Subscribers) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "nodeplug_watcher_subscriber_bytes",
				Help: "Bytes of events the WatchSocketEvents subscriptions hold, not yet sent to their clients.",
			}, func() float64 { return float64(hub().Held) }))
	}
	return m
}
