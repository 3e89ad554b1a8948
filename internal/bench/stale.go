package bench

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
)

// StaleResult is a healthy plugin's registration latency, alone and beside
// socket files in plugins_registry that refuse connections (left by plugins
// killed without cleanup), measured in the same run.
type StaleResult struct {
	Stale int `json:"stale_sockets"`
	// Socket listen → NotifyRegistrationStatus(registered=true), one healthy
	// device plugin at a time with plugins_registry otherwise empty.
	Quiet Dist `json:"quiet_notify"`
	// The same, while the stale sockets are present and being retried.
	BesideStale Dist `json:"beside_stale_notify"`
	// BesideStale / Quiet, at p50 and p99; the target is ≤ 2.
	RatioP50 float64 `json:"ratio_p50"`
	RatioP99 float64 `json:"ratio_p99"`
}

// staleRatioTarget is DESIGN's bound: beside stale sockets a healthy plugin
// registers within twice its quiet latency.
const staleRatioTarget = 2.0

// stale measures the quiet figure, then creates cfg.StaleSockets stale
// socket files and measures again while the watcher is still retrying them.
func (r *runner) stale(ctx context.Context) (StaleResult, error) {
	n, k := r.cfg.StaleSockets, r.cfg.StaleSamples
	out := StaleResult{Stale: n}
	r.logf("stale sockets: %d healthy registrations alone, then beside %d stale sockets", k, n)
	quiet, err := r.healthySamples(ctx, "quiet", k)
	if err != nil {
		return out, fmt.Errorf("quiet: %w", err)
	}
	paths, err := r.makeStale(n)
	defer func() {
		for _, p := range paths {
			_ = os.Remove(p)
		}
	}()
	if err != nil {
		return out, err
	}
	beside, err := r.healthySamples(ctx, "beside", k)
	if err != nil {
		return out, fmt.Errorf("beside stale sockets: %w", err)
	}
	out.Quiet, out.BesideStale = NewDist(quiet), NewDist(beside)
	out.RatioP50, out.RatioP99 = ratio(out.BesideStale.P50, out.Quiet.P50), ratio(out.BesideStale.P99, out.Quiet.P99)
	for _, p := range paths {
		_ = os.Remove(p)
	}
	paths = nil
	// Leave no stale entry behind for the next phase.
	if err := r.quiesce(ctx); err != nil {
		return out, fmt.Errorf("after removing the stale sockets: %w", err)
	}
	r.logf("  quiet  %v\n  beside %v\n  ratio p50 %.2f, p99 %.2f (target ≤ %.0f)", out.Quiet, out.BesideStale, out.RatioP50, out.RatioP99, staleRatioTarget)
	return out, nil
}

func ratio(a, b float64) float64 {
	if b <= 0 {
		return 0
	}
	return round2(a / b)
}

// makeStale creates n socket files in plugins_registry that refuse
// connections: even ones were bound and listened on, then closed without
// unlinking (a plugin killed without cleanup); odd ones are bound but never
// listened on, their descriptor closed at once. It returns the paths made so
// far even on error, so the caller can remove them.
func (r *runner) makeStale(n int) ([]string, error) {
	paths := make([]string, 0, n)
	for i := 0; i < n; i++ {
		path := r.socket("stale")
		if err := stack.StaleSocket(path, i%2 == 0); err != nil {
			return paths, fmt.Errorf("stale socket %s: %w", path, err)
		}
		paths = append(paths, path)
	}
	return paths, nil
}

// healthySamples registers k healthy device plugins one after the other and
// returns each one's listen → NotifyRegistrationStatus(true) latency. Each is
// deregistered before the next starts.
func (r *runner) healthySamples(ctx context.Context, label string, k int) ([]time.Duration, error) {
	var out []time.Duration
	for i := 0; i < k; i++ {
		dp, err := r.newDevicePlugin(fmt.Sprintf("bench.example.com/stale-%s-%d", label, i), 1)
		if err != nil {
			return nil, err
		}
		if err := dp.start(); err != nil {
			return nil, err
		}
		t, err := registeredAt(ctx, dp.Registration, dp.Resource()+" registered")
		if err != nil {
			dp.Stop()
			return nil, err
		}
		out = append(out, t.Sub(dp.started))
		gone := r.plugs.wait(dp.final, nil)
		remove(dp.final, dp.Stop)
		if _, err := waitTime(ctx, gone, dp.final+" deregistered"); err != nil {
			return nil, err
		}
	}
	return out, nil
}
