package testutil

import dto "github.com/prometheus/client_model/go"

// FindMetric returns the first series of the metric family called name in
// families whose labels include every pair in labels (nil matches any
// series), or nil when there is none.
func FindMetric(families []*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	for _, mf := range families {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue series
				}
			}
			return m
		}
	}
	return nil
}

// MetricValue returns the value of a counter or a gauge, or the sample
// count of a histogram; false for a nil series or any other kind.
func MetricValue(m *dto.Metric) (float64, bool) {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue(), true
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue(), true
	case m.GetHistogram() != nil:
		return float64(m.GetHistogram().GetSampleCount()), true
	}
	return 0, false
}
