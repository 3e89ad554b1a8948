package drivers

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	instances *prometheus.GaugeVec
	deletions *prometheus.CounterVec
	slices    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		instances: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nodeplug_dra_driver_instances",
			Help: "Registered instances of each DRA driver, by connection state (connected, disconnected).",
		}, []string{"driver", "state"}),
		deletions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_dra_resource_slice_deletions_total",
			Help: "Deletions of a DRA driver's ResourceSlices on this node, by reason: disconnected (no instance stayed connected past the delay) or absent (not registered again within the delay after a start).",
		}, []string{"driver", "reason"}),
		slices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nodeplug_dra_resource_slices_deleted_total",
			Help: "ResourceSlices on this node deleted because their DRA driver had no connected instance (as listed just before each deletion), by reason as nodeplug_dra_resource_slice_deletions_total.",
		}, []string{"driver", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.instances, m.deletions, m.slices)
	}
	return m
}

// setInstances sets driver's instance gauges; a driver with none loses
// its series.
func (m *metrics) setInstances(driver string, list []*instance) {
	if len(list) == 0 {
		m.instances.DeleteLabelValues(driver, "connected")
		m.instances.DeleteLabelValues(driver, "disconnected")
		return
	}
	connected := 0
	for _, in := range list {
		if in.connected {
			connected++
		}
	}
	m.instances.WithLabelValues(driver, "connected").Set(float64(connected))
	m.instances.WithLabelValues(driver, "disconnected").Set(float64(len(list) - connected))
}

// deleted counts one deletion of n slices (n < 0: not known).
func (m *metrics) deleted(driver, reason string, n int) {
	m.deletions.WithLabelValues(driver, reason).Inc()
	if n > 0 {
		m.slices.WithLabelValues(driver, reason).Add(float64(n))
	}
}
