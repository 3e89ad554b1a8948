package resourceapi

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics counts the API's requests. Labels come from fixed sets: the
// verb and resource of a request this server routes ("" for discovery and
// paths it does not serve), never from the URL as sent.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	watches  prometheus.Gauge
	// watchesRefused counts watches refused by the bound they hit
	// (per_caller, total); watchCutoffs watches cut off by the bound
	// they exceeded (buffer_events, buffer_bytes, history).
	watchesRefused *prometheus.CounterVec
	watchCutoffs   *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, st *Store) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_resource_api_requests_total",
			Help: "Requests to the node-local resource API by verb, resource and HTTP code.",
		}, []string{"verb", "resource", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "nodeplug_resource_api_request_duration_seconds",
			Help:    "Time to answer a request to the node-local resource API, by verb (watches not included).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 4, 9),
		}, []string{"verb"}),
		watches: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "nodeplug_resource_api_watches",
			Help: "Watches open on the node-local resource API.",
		}),
		watchesRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_resource_api_watches_refused_total",
			Help: "Watches of the node-local resource API refused (429) by the bound they hit: per_caller or total.",
		}, []string{"bound"}),
		watchCutoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_resource_api_watch_cutoffs_total",
			Help: "Watches of the node-local resource API cut off because their client fell behind, by the bound: buffer_events, buffer_bytes or history.",
		}, []string{"bound"}),
	}
	for _, b := range []string{boundPerCaller, boundTotal} {
		m.watchesRefused.WithLabelValues(b)
	}
	for _, b := range []string{boundEvents, boundBytes, boundHistory} {
		m.watchCutoffs.WithLabelValues(b)
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.watches, m.watchesRefused, m.watchCutoffs, historyGauge(st, "events"), historyGauge(st, "bytes"))
	}
	return m
}

func (m *metrics) observe(req request, code int, took time.Duration) {
	resource, verb := "", req.verb
	if req.kind != nil {
		resource = req.kind.resource
		if req.subresource != "" {
			resource += "/" + req.subresource
		}
	}
	switch verb {
	case "get", "list", "watch", "create", "update", "patch", "delete", "deletecollection":
	default:
		verb = "other"
	}
	m.requests.WithLabelValues(verb, resource, strconv.Itoa(code)).Inc()
	if verb != "watch" {
		m.duration.WithLabelValues(verb).Observe(took.Seconds())
	}
}

// historyGauge reports the watch history's size in events or bytes.
func historyGauge(st *Store, unit string) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "nodeplug_resource_api_watch_history_" + unit,
		Help: "The " + unit + " the node-local resource API's watch history holds (bounded by --resource-api-watch-history-" + unit + ").",
	}, func() float64 {
		events, bytes := st.HistorySize()
		if unit == "events" {
			return float64(events)
		}
		return float64(bytes)
	})
}
