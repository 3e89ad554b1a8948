package manager

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	registrations *prometheus.CounterVec
	devices       *prometheus.GaugeVec
	allocDuration *prometheus.HistogramVec
	allocations   *prometheus.CounterVec
	released      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubelet_device_plugin_registration_total",
			Help: "Cumulative number of successful device plugin registrations, by both registration paths: RegisterPlugin (plugins_registry, through the reconciler) and v1beta1 Register on kubelet.sock. Unlike the kubelet, which counts only kubelet.sock registrations, and every attempt: a refused registration is not counted, so labels only name registered resources.",
		}, []string{"resource_name"}),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubelet_device_plugin_devices",
			Help: "Number of devices of a device plugin resource, by health state (healthy, unhealthy).",
		}, []string{"resource_name", "health_state"}),
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
		reg.MustRegister(m.registrations, m.devices, m.allocDuration, m.allocations, m.released)
	}
	return m
}

// forget drops the series of a removed resource, so that those of
// resources long gone do not pile up: its device gauges and its
// registration count (which starts again from zero, as a counter may, if
// the resource registers again).
func (m *metrics) forget(resource string) {
	m.devices.DeleteLabelValues(resource, "healthy")
	m.devices.DeleteLabelValues(resource, "unhealthy")
	m.registrations.DeleteLabelValues(resource)
}
