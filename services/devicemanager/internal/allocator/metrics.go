package allocator

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	allocDuration *prometheus.HistogramVec
	allocations   *prometheus.CounterVec
	released      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		allocDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubelet_device_plugin_alloc_duration_seconds",
			Help:    "Duration in seconds of the device plugin Allocate calls, errors included.",
			Buckets: prometheus.DefBuckets,
		}, []string{"resource_name"}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_devicemanager_allocations_total",
			Help: "Allocate results per resource: allocated (new devices), reused (the saved answer of an identical request) or failed.",
		}, []string{"resource_name", "result"}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_devicemanager_released_devices_total",
			Help: "Devices freed by Release, per resource.",
		}, []string{"resource_name"}),
	}
	if reg != nil {
		reg.MustRegister(m.allocDuration, m.allocations, m.released)
	}
	return m
}
