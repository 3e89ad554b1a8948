package socketwatch

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	events  *prometheus.CounterVec
	sockets prometheus.Gauge
	rescans prometheus.Counter
	dropped prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, subscribers func() int) *metrics {
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
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeplug_watcher_slow_subscribers_dropped_total",
			Help: "Subscribers closed with RESOURCE_EXHAUSTED because they fell behind the stream buffer.",
		}),
	}
	// Both label values exist from the start, so rates work before the
	// first event.
	m.events.WithLabelValues(Created.String())
	m.events.WithLabelValues(Deleted.String())
	if reg != nil {
		reg.MustRegister(m.events, m.sockets, m.rescans, m.dropped,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "nodeplug_watcher_subscribers",
				Help: "Open WatchSocketEvents subscriptions.",
			}, func() float64 { return float64(subscribers()) }))
	}
	return m
}
