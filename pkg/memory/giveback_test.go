package memory

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestGiverRunsHookThenRelease: each Give runs the service's hook before
// the release, and counts the give-back and the bytes returned under the
// service's metric names.
func TestGiverRunsHookThenRelease(t *testing.T) {
	var order []string
	reg := prometheus.NewRegistry()
	g := NewGiver(GiverOptions{
		Hook:    func() { order = append(order, "hook") },
		Release: func() (uint64, uint64) { order = append(order, "release"); return 5000, 1000 },
		Metrics: "test_memory", Burst: "tests", Registerer: reg,
	})
	g.Give("changes", 3)
	g.Give()
	if len(order) != 4 || order[0] != "hook" || order[1] != "release" || order[2] != "hook" {
		t.Fatalf("order %v, want hook then release, twice", order)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		got[mf.GetName()] = counter(mf)
	}
	if got["test_memory_give_backs_total"] != 2 || got["test_memory_given_back_bytes_total"] != 8000 {
		t.Fatalf("metrics %v", got)
	}
}

func counter(mf *dto.MetricFamily) float64 {
	if len(mf.GetMetric()) == 0 {
		return -1
	}
	return mf.GetMetric()[0].GetCounter().GetValue()
}
