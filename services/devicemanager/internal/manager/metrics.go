package manager

import (
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

type metrics struct {
	registrations *prometheus.CounterVec
	allocDuration *prometheus.HistogramVec
	devices       *prometheus.GaugeVec
	allocations   *prometheus.CounterVec
	released      *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubelet_device_plugin_registration_total",
			Help: "Cumulative number of device plugin registrations, by both registration paths: RegisterPlugin (plugins_registry, through the reconciler) and v1beta1 Register on kubelet.sock. Unlike the kubelet, which counts only kubelet.sock registrations.",
		}, []string{"resource_name"}),
		allocDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "kubelet_device_plugin_alloc_duration_seconds",
			Help:    "Duration in seconds of the device plugin Allocate calls, errors included.",
			Buckets: prometheus.DefBuckets,
		}, []string{"resource_name"}),
		devices: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "kubelet_device_plugin_devices",
			Help: "Number of devices of a device plugin resource, by health state (healthy, unhealthy).",
		}, []string{"resource_name", "health_state"}),
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
		reg.MustRegister(m.registrations, m.allocDuration, m.devices, m.allocations, m.released)
	}
	return m
}

// forget drops the device gauge series of a removed resource.
func (m *metrics) forget(resource string) {
	m.devices.DeleteLabelValues(resource, "healthy")
	m.devices.DeleteLabelValues(resource, "unhealthy")
}

// newPluginConn returns a lazy connection to a plugin socket.
func newPluginConn(path string) (*grpc.ClientConn, error) {
	return rpcutil.DialPlugin(path)
}
