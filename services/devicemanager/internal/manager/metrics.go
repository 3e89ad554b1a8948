package manager

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	registrations *prometheus.CounterVec
	devices       *prometheus.GaugeVec
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
	}
	if reg != nil {
		reg.MustRegister(m.registrations, m.devices)
	}
	return m
}

// forget drops the device gauge series of a removed resource.
func (m *metrics) forget(resource string) {
	m.devices.DeleteLabelValues(resource, "healthy")
	m.devices.DeleteLabelValues(resource, "unhealthy")
}
