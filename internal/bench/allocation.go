package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

func (r *runner) allocation(ctx context.Context) ([]AllocationResult, error) {
	var out []AllocationResult
	for _, devices := range r.cfg.AllocDevices {
		dp, err := r.newDevicePlugin(fmt.Sprintf("bench.example.com/alloc%d", devices), devices)
		if err != nil {
			return nil, err
		}
		ready := r.res.wait(dp.Resource(), allocatable(int64(devices)))
		if err := dp.start(); err != nil {
			return nil, err
		}
		if _, err := waitTime(ctx, ready, dp.Resource()+" allocatable"); err != nil {
			dp.Stop()
			return nil, err
		}
		for _, callers := range r.cfg.AllocCallers {
			res, err := r.allocRun(ctx, dp.Resource(), devices, callers)
			if err != nil {
				dp.Stop()
				return nil, err
			}
			out = append(out, res)
		}
		dp.Stop()
	}
	return out, nil
}

func (r *runner) allocRun(ctx context.Context, resource string, devices, callers int) (AllocationResult, error) {
	r.logf("allocation: %d devices, %d callers, %v", devices, callers, r.cfg.AllocDuration)
	out := AllocationResult{Devices: devices, Callers: callers}
	var mu sync.Mutex
	var allocs, releases []time.Duration
	var firstErr error
	deadline := time.Now().Add(r.cfg.AllocDuration)
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				pod := fmt.Sprintf("bench-%d-%d-%d", devices, c, i)
				t0 := time.Now()
				_, err := r.dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: pod, ContainerName: "c",
					Resources: []*dmv1.ResourceRequest{{ResourceName: resource, Count: 1}}})
				t1 := time.Now()
				if err == nil {
					_, err = r.dm.Release(ctx, &dmv1.ReleaseRequest{PodUid: pod})
				}
				t2 := time.Now()
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = fmt.Errorf("%s: %w", pod, err)
				}
				allocs = append(allocs, t1.Sub(t0))
				releases = append(releases, t2.Sub(t1))
				mu.Unlock()
				if err != nil {
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return out, firstErr
	}
	out.Pairs = len(allocs)
	out.PairsPerSec = float64(out.Pairs) / time.Since(start).Seconds()
	out.Allocate, out.Release = NewDist(allocs), NewDist(releases)
	r.logf("  %d pairs, %.0f/s\n  allocate %v\n  release  %v", out.Pairs, out.PairsPerSec, out.Allocate, out.Release)
	return out, nil
}
