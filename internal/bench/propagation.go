package bench

import (
	"context"
	"time"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

func (r *runner) propagation(ctx context.Context) (PropagationResult, error) {
	n := r.cfg.FlipDevices
	r.logf("propagation: %d health flips with %d devices", r.cfg.Flips, n)
	out := PropagationResult{Devices: n}
	dp, err := r.newDevicePlugin("bench.example.com/flip", n)
	if err != nil {
		return out, err
	}
	defer dp.Stop()
	ready := r.res.wait(dp.Resource(), allocatable(int64(n)))
	if err := dp.start(); err != nil {
		return out, err
	}
	if _, err := waitTime(ctx, ready, dp.Resource()+" allocatable"); err != nil {
		return out, err
	}
	var lat []time.Duration
	for i := 0; i < r.cfg.Flips; i++ {
		healthy := i%2 == 1
		want := int64(n - 1)
		if healthy {
			want = int64(n)
		}
		seen := r.res.wait(dp.Resource(), func(res *dmv1.Resource) bool { return res.GetAllocatable() == want })
		t0 := time.Now()
		if err := dp.SetHealth("dev-0", healthy); err != nil {
			return out, err
		}
		t, err := waitTime(ctx, seen, "health flip")
		if err != nil {
			return out, err
		}
		lat = append(lat, t.Sub(t0))
	}
	out.Latency = NewDist(lat)
	r.logf("  %v", out.Latency)
	return out, nil
}
