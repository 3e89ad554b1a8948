package bench

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
)

// churn registers and removes DRA plugins from cfg.ChurnWorkers workers
// for cfg.ChurnDuration beside cfg.ChurnResident plugins that stay, then
// checks that exactly the resident ones are left.
func (r *runner) churn(ctx context.Context) (ChurnResult, error) {
	cfg := r.cfg
	r.logf("churn: %d workers for %v with %d resident plugins", cfg.ChurnWorkers, cfg.ChurnDuration, cfg.ChurnResident)
	out := ChurnResult{Workers: cfg.ChurnWorkers, Resident: cfg.ChurnResident}
	resident, plugins, err := r.startResident(ctx, cfg.ChurnResident)
	if err != nil {
		return out, err
	}
	defer stopReversed(plugins)
	if err := r.churnLoad(ctx, &out); err != nil {
		return out, err
	}
	if err := r.churnFinalState(ctx, resident, &out); err != nil {
		return out, err
	}
	r.logf("  %d cycles, %.1f/s\n  register %v\n  deregister %v\n  final state exact: %v %s", out.Cycles, out.CyclesPerSec, out.Register, out.Deregister, out.FinalExact, out.FinalProblem)
	return out, nil
}

// startResident starts n DRA plugins and waits for each to register. It
// returns their driver names by socket path and the plugins, to be
// stopped with stopReversed; on an error it stops those it started.
func (r *runner) startResident(ctx context.Context, n int) (map[string]string, []*testplugin.Plugin, error) {
	resident := map[string]string{} // socket → driver name
	var plugins []*testplugin.Plugin
	for i := 0; i < n; i++ {
		p, name, err := r.draPlugin("resident")
		if err != nil {
			stopReversed(plugins)
			return nil, nil, err
		}
		plugins = append(plugins, p)
		resident[p.Path()] = name
		if _, err := registeredAt(ctx, p.Registration, "resident plugin "+name); err != nil {
			stopReversed(plugins)
			return nil, nil, err
		}
	}
	return resident, plugins, nil
}

// stopReversed stops plugins, the last started first.
func stopReversed(plugins []*testplugin.Plugin) {
	for i := len(plugins) - 1; i >= 0; i-- {
		plugins[i].Stop()
	}
}

// churnTally collects the workers' latencies and their first error; it is
// safe for concurrent use.
type churnTally struct {
	mu         sync.Mutex
	reg, dereg []time.Duration
	firstErr   error
}

// add records one cycle's registration and deregistration latencies.
func (t *churnTally) add(reg, dereg time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reg = append(t.reg, reg)
	t.dereg = append(t.dereg, dereg)
}

// fail records err unless an error was recorded before.
func (t *churnTally) fail(err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.firstErr == nil {
		t.firstErr = err
	}
}

// churnLoad runs cfg.ChurnWorkers workers, each cycling DRA plugins until
// cfg.ChurnDuration passed or a cycle failed, and fills out's cycle
// figures.
func (r *runner) churnLoad(ctx context.Context, out *ChurnResult) error {
	var t churnTally
	deadline := time.Now().Add(r.cfg.ChurnDuration)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < r.cfg.ChurnWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := r.churnCycle(ctx, &t); err != nil {
					t.fail(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.firstErr != nil {
		return t.firstErr
	}
	out.Seconds = time.Since(start).Seconds()
	out.Cycles = len(t.reg)
	out.CyclesPerSec = float64(out.Cycles) / out.Seconds
	out.Register, out.Deregister = NewDist(t.reg), NewDist(t.dereg)
	return nil
}

// churnCycle starts a DRA plugin, waits for its registration, removes its
// socket and waits for its deregistration, and adds both latencies to t.
func (r *runner) churnCycle(ctx context.Context, t *churnTally) error {
	t0 := time.Now()
	p, _, err := r.draPlugin("churn")
	if err != nil {
		return err
	}
	registered, err := registeredAt(ctx, p.Registration, p.Path()+" registered")
	if err != nil {
		p.Stop()
		return err
	}
	gone := r.plugs.wait(p.Path(), nil)
	t1 := remove(p.Path(), p.Stop)
	t2, err := waitTime(ctx, gone, p.Path()+" deregistered")
	t.add(registered.Sub(t0), t2.Sub(t1))
	return err
}

// churnFinalState lists the reconciler's plugins and DRA drivers and
// records in out whether they are exactly the resident plugins, all
// registered, and exactly their DRA drivers.
func (r *runner) churnFinalState(ctx context.Context, resident map[string]string, out *ChurnResult) error {
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	plugins, err := r.rc.ListPlugins(lctx, &rcv1.ListPluginsRequest{})
	if err != nil {
		return err
	}
	drivers, err := r.rc.ListDrivers(lctx, &rcv1.ListDriversRequest{})
	if err != nil {
		return err
	}
	var problems []string
	out.Leftover, problems = finalStateProblems(resident, plugins.GetPlugins(), drivers.GetDraDrivers())
	out.FinalExact = len(problems) == 0
	out.FinalProblem = strings.Join(problems, "; ")
	return nil
}

// finalStateProblems compares the plugins and DRA drivers listed with the
// resident plugins (socket path → driver name). leftover is what is listed
// but not resident, sorted; problems what differs, leftover included.
func finalStateProblems(resident map[string]string, plugins []*rcv1.Plugin, drivers []*rcv1.DRADriver) (leftover, problems []string) {
	seen := map[string]bool{}
	for _, p := range plugins {
		seen[p.GetSocketPath()] = true
		if _, ok := resident[p.GetSocketPath()]; !ok {
			leftover = append(leftover, p.GetSocketPath())
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
	for _, d := range drivers {
		names[d.GetName()] = true
	}
	for _, name := range resident {
		if !names[name] {
			problems = append(problems, "DRA driver "+name+" missing")
		}
		delete(names, name)
	}
	for name := range names {
		leftover = append(leftover, "DRA driver "+name)
	}
	sort.Strings(leftover)
	if len(leftover) > 0 {
		problems = append(problems, fmt.Sprintf("%d entries left over", len(leftover)))
	}
	return leftover, problems
}
