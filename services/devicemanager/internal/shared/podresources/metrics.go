package podresources

import "github.com/prometheus/client_golang/prometheus"

// metrics are the kubelet's pod resources metrics, under its names, with
// its server_api_version label (always "v1" here), and nodeplug's count of
// calls the rate limit refused.
type metrics struct {
	total, list, getAllocatable, get prometheus.Counter
	getErrors                        prometheus.Counter
	rejected                         prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	vec := func(name, help string) prometheus.Counter {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "kubelet", Name: name, Help: help}, []string{"server_api_version"})
		if reg != nil {
			reg.MustRegister(v)
		}
		return v.WithLabelValues(apiVersion)
	}
	m := &metrics{
		total:          vec("pod_resources_endpoint_requests_total", "Cumulative number of requests to the PodResource endpoint. Broken down by server api version."),
		list:           vec("pod_resources_endpoint_requests_list", "Number of requests to the PodResource List endpoint. Broken down by server api version."),
		getAllocatable: vec("pod_resources_endpoint_requests_get_allocatable", "Number of requests to the PodResource GetAllocatableResources endpoint. Broken down by server api version."),
		get:            vec("pod_resources_endpoint_requests_get", "Number of requests to the PodResource Get endpoint. Broken down by server api version."),
		getErrors:      vec("pod_resources_endpoint_errors_get", "Number of requests to the PodResource Get endpoint which returned error. Broken down by server api version."),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nodeplug_pod_resources_rejected_total",
			Help: "Calls of the pod resources API refused by its rate limit (RESOURCE_EXHAUSTED); they are not counted in kubelet_pod_resources_endpoint_requests_total, as in the kubelet.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.rejected)
	}
	return m
}

// requests counts one call that reached the server, in the total and in
// its method's counter.
func (m *metrics) requests(method prometheus.Counter) {
	m.total.Inc()
	method.Inc()
}
