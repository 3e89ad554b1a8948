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
}

func newMetrics(reg prometheus.Registerer) *metrics {
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
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.duration, m.watches)
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
