package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
)

func (r *runner) churn(ctx context.Context) (ChurnResult, error) {
	cfg := r.cfg
	r.logf("churn: %d workers for %v with %d resident plugins", cfg.ChurnWorkers, cfg.ChurnDuration, cfg.ChurnResident)
	out := ChurnResult{Workers: cfg.ChurnWorkers, Resident: cfg.ChurnResident}
	resident := map[string]string{} // socket → driver name
	for i := 0; i < cfg.ChurnResident; i++ {
		p, name, err := r.draPlugin("resident")
		if err != nil {
			return out, err
		}
		defer p.Stop()
		resident[p.Path()] = name
		if _, err := registeredAt(ctx, p.Registration, "resident plugin "+name); err != nil {
			return out, err
		}
	}
	var mu sync.Mutex
	var reg, dereg []time.Duration
	var firstErr error
	deadline := time.Now().Add(cfg.ChurnDuration)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < cfg.ChurnWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				t0 := time.Now()
				p, _, err := r.draPlugin("churn")
				if err == nil {
					var registered time.Time
					registered, err = registeredAt(ctx, p.Registration, p.Path()+" registered")
					if err == nil {
						gone := r.plugs.wait(p.Path(), nil)
						t1 := remove(p.Path(), p.Stop)
						var t2 time.Time
						t2, err = waitTime(ctx, gone, p.Path()+" deregistered")
						mu.Lock()
						reg = append(reg, registered.Sub(t0))
						dereg = append(dereg, t2.Sub(t1))
						mu.Unlock()
					} else {
						p.Stop()
					}
				}
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return out, firstErr
	}
	out.Seconds = time.Since(start).Seconds()
	out.Cycles = len(reg)
	out.CyclesPerSec = float64(out.Cycles) / out.Seconds
	out.Register, out.Deregister = NewDist(reg), NewDist(dereg)

	// The final state must be exactly the resident plugins, all registered,
	// and exactly their DRA drivers.
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	plugins, err := r.rc.ListPlugins(lctx, &rcv1.ListPluginsRequest{})
	if err != nil {
		return out, err
	}
	drivers, err := r.rc.ListDrivers(lctx, &rcv1.ListDriversRequest{})
	if err != nil {
		return out, err
	}
	var problems []string
	seen := map[string]bool{}
	for _, p := range plugins.GetPlugins() {
		seen[p.GetSocketPath()] = true
		if _, ok := resident[p.GetSocketPath()]; !ok {
			out.Leftover = append(out.Leftover, p.GetSocketPath())
		} else if p.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED {
			problems = append(problems, fmt.Sprintf("%s is %v", p.GetSocketPath(), p.GetState()))
		}
	}
	for path := range resident {
		if !seen[path] {
			problems = append(problems, path+" missing")
		}
	}
	names := map[string]bool{}
	for _, d := range drivers.GetDraDrivers() {
		names[d.GetName()] = true
	}
	for _, name := range resident {
		if !names[name] {
			problems = append(problems, "DRA driver "+name+" missing")
		}
		delete(names, name)
	}
	for name := range names {
		out.Leftover = append(out.Leftover, "DRA driver "+name)
	}
	sort.Strings(out.Leftover)
	if len(out.Leftover) > 0 {
		problems = append(problems, fmt.Sprintf("%d entries left over", len(out.Leftover)))
	}
	out.FinalExact = len(problems) == 0
	out.FinalProblem = strings.Join(problems, "; ")
	r.logf("  %d cycles, %.1f/s\n  register %v\n  deregister %v\n  final state exact: %v %s", out.Cycles, out.CyclesPerSec, out.Register, out.Deregister, out.FinalExact, out.FinalProblem)
	return out, nil
}
