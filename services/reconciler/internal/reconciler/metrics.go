package reconciler

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

// metrics are the reconciler's Prometheus metrics.
type metrics struct {
	r             *Reconciler
	registrations *prometheus.CounterVec
	deregs        *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	totalDesc     *prometheus.Desc
	statesDesc    *prometheus.Desc
}

func newMetrics(r *Reconciler) *metrics {
	return &metrics{
		r: r,
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_plugin_registrations_total",
			Help: "Plugin registration attempts by plugin type (DevicePlugin, CSIPlugin, DRAPlugin; other for unhandled types, unknown when GetInfo failed) and result (success or failure).",
		}, []string{"type", "result"}),
		deregs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_plugin_deregistrations_total",
			Help: "Plugin deregistrations by plugin type and result (success or failure of the handler).",
		}, []string{"type", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodeplug_plugin_registration_duration_seconds",
			Help:    "Duration of plugin registration attempts (GetInfo to NotifyRegistrationStatus) by plugin type.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 15),
		}, []string{"type"}),
		totalDesc: prometheus.NewDesc("plugin_manager_total_plugins",
			"Number of plugins in Plugin Manager", []string{"socket_path", "state"}, nil),
		statesDesc: prometheus.NewDesc("nodeplug_plugins",
			"Number of plugin sockets by registration state (pending, registered, failed).", []string{"state"}, nil),
	}
}

func result(err error) string {
	if err != nil {
		return "failure"
	}
	return "success"
}

// typeLabel bounds the type label: a plugin names its own type, so only
// the handled types are used as they are.
func (m *metrics) typeLabel(typ string) string {
	switch {
	case typ == "":
		return "unknown" // GetInfo did not answer
	case m.r.handlers[typ] != nil:
		return typ
	}
	return "other"
}

func (m *metrics) observeRegistration(typ string, err error, d time.Duration) {
	typ = m.typeLabel(typ)
	m.registrations.WithLabelValues(typ, result(err)).Inc()
	m.latency.WithLabelValues(typ).Observe(d.Seconds())
}

func (m *metrics) observeDeregistration(typ string, err error) {
	m.deregs.WithLabelValues(m.typeLabel(typ), result(err)).Inc()
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.totalDesc
	ch <- m.statesDesc
	m.registrations.Describe(ch)
	m.deregs.Describe(ch)
	m.latency.Describe(ch)
}

// Collect implements prometheus.Collector: plugin_manager_total_plugins is
// read from the DSW and ASW at scrape time, as the kubelet's collector does.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	// A label value must be UTF-8 (MustNewConstMetric panics otherwise):
	// a socket path that is not is labelled quoted (bounds.PathText).
	for _, s := range m.r.dsw.List() {
		ch <- prometheus.MustNewConstMetric(m.totalDesc, prometheus.GaugeValue, 1, bounds.PathText(s.Path), "desired_state_of_world")
	}
	for _, p := range m.r.asw.List() {
		ch <- prometheus.MustNewConstMetric(m.totalDesc, prometheus.GaugeValue, 1, bounds.PathText(p.SocketPath), "actual_state_of_world")
	}
	counts := map[status.State]int{status.StatePending: 0, status.StateRegistered: 0, status.StateFailed: 0}
	for _, s := range m.r.status.List() {
		counts[s.State]++
	}
	for st, n := range counts {
		ch <- prometheus.MustNewConstMetric(m.statesDesc, prometheus.GaugeValue, float64(n), st.String())
	}
	m.registrations.Collect(ch)
	m.deregs.Collect(ch)
	m.latency.Collect(ch)
}

// RegisterMetrics registers the reconciler's metrics with reg.
func (r *Reconciler) RegisterMetrics(reg prometheus.Registerer) error {
	return reg.Register(r.metrics)
}
