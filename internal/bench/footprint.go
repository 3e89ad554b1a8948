package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
)

func (r *runner) footprint(ctx context.Context) (FootprintResult, error) {
	cfg := r.cfg
	out := FootprintResult{IdlePlugins: cfg.IdlePlugins, RSSMiB: map[string]float64{}, IdleCPUPercent: map[string]float64{}, DeviceManagerPlugins: cfg.RSSPlugins}
	r.logf("footprint: %d registration-only plugins, idle for %v", cfg.IdlePlugins, cfg.IdleWindow)
	var plugins []*testplugin.Plugin
	defer func() {
		for _, p := range plugins {
			p.Stop()
		}
	}()
	for i := 0; i < cfg.IdlePlugins; i++ {
		p, _, err := r.draPlugin("idle")
		if err != nil {
			return out, err
		}
		plugins = append(plugins, p)
	}
	for _, p := range plugins {
		if _, err := registeredAt(ctx, p.Registration, p.Path()+" registered"); err != nil {
			return out, err
		}
	}
	time.Sleep(cfg.IdleWindow / 2) // let start-up work settle before sampling
	before := map[string]float64{}
	for _, s := range stack.Services {
		before[s], _ = cpuSeconds(r.st.Process(s).Cmd.Process.Pid)
	}
	t0 := time.Now()
	time.Sleep(cfg.IdleWindow)
	elapsed := time.Since(t0).Seconds()
	for _, s := range stack.Services {
		pid := r.st.Process(s).Cmd.Process.Pid
		after, err := cpuSeconds(pid)
		if err != nil {
			return out, err
		}
		out.IdleCPUPercent[s] = round2(100 * (after - before[s]) / elapsed)
		rss, err := rssMiB(pid)
		if err != nil {
			return out, err
		}
		out.RSSMiB[s] = round2(rss)
	}
	r.logf("  rss MiB %v\n  idle cpu %% %v", out.RSSMiB, out.IdleCPUPercent)

	r.logf("footprint: devicemanager RSS with %d device plugins", cfg.RSSPlugins)
	dmPid := r.st.Process("devicemanager").Cmd.Process.Pid
	base, err := rssMiB(dmPid)
	if err != nil {
		return out, err
	}
	if err := r.heapProfile(ctx, "devicemanager", "before"); err != nil {
		return out, err
	}
	var dps []*devicePlugin
	defer func() {
		for _, dp := range dps {
			dp.Stop()
		}
	}()
	for i := 0; i < cfg.RSSPlugins; i++ {
		dp, err := r.newDevicePlugin(fmt.Sprintf("bench.example.com/rss-%d", i), 2)
		if err != nil {
			return out, err
		}
		dps = append(dps, dp)
	}
	for _, dp := range dps {
		if err := dp.start(); err != nil {
			return out, err
		}
	}
	for _, dp := range dps {
		if _, err := waitTime(ctx, r.res.wait(dp.Resource(), allocatable(2)), dp.Resource()+" allocatable"); err != nil {
			return out, err
		}
	}
	time.Sleep(cfg.IdleWindow / 2)
	loaded, err := rssMiB(dmPid)
	if err != nil {
		return out, err
	}
	if err := r.heapProfile(ctx, "devicemanager", "loaded"); err != nil {
		return out, err
	}
	out.DeviceManagerBaseMiB, out.DeviceManagerLoadedMiB = round2(base), round2(loaded)
	if cfg.RSSPlugins > 0 {
		out.DeviceManagerPerPlugin = round2((loaded - base) * 1024 / float64(cfg.RSSPlugins))
	}
	r.logf("  devicemanager %.1f MiB → %.1f MiB, %.1f KiB per plugin", base, loaded, out.DeviceManagerPerPlugin)
	paths := make([]string, len(dps))
	for i, dp := range dps {
		paths[i] = dp.final
	}
	if out.Bare, err = r.bareClient(ctx, paths); err != nil {
		return out, err
	}
	out.DeviceManagerOverBare = ratio(out.DeviceManagerPerPlugin, out.Bare.KiBPerConn)
	r.logf("  bare grpc-go client: %.1f KiB and %.2f goroutines per connection with one stream; devicemanager / bare %.2f (target ≤ 1.1)",
		out.Bare.KiBPerConn, out.Bare.GoroutinesPer, out.DeviceManagerOverBare)

	// The plugins leave: once the devicemanager forgot them (their grace
	// period ended), how much of the burst's memory did it give back?
	for _, dp := range dps {
		remove(dp.final, dp.Stop)
	}
	dps = nil
	if err := r.noResources(ctx); err != nil {
		return out, err
	}
	time.Sleep(cfg.IdleWindow / 2)
	after, err := rssMiB(dmPid)
	if err != nil {
		return out, err
	}
	if err := r.heapProfile(ctx, "devicemanager", "after"); err != nil {
		return out, err
	}
	out.DeviceManagerAfterMiB = round2(after)
	out.DeviceManagerAfterOverBase = ratio(after, base)
	r.logf("  devicemanager after the plugins left: %.1f MiB (%.2f× its RSS before them; target ≤ 1.2×); the bare client after closing its connections: %.2f× its own",
		after, out.DeviceManagerAfterOverBase, out.Bare.ClosedOverBefore)
	return out, nil
}

// cpuByService returns the CPU seconds each service has used so far.
func (r *runner) cpuByService() map[string]float64 {
	out := map[string]float64{}
	for _, s := range stack.Services {
		if v, err := cpuSeconds(r.st.Process(s).Cmd.Process.Pid); err == nil {
			out[s] = v
		}
	}
	return out
}

func round2(v float64) float64 { return float64(int64(v*100+0.5)) / 100 }

// rssMiB reads VmRSS from /proc/<pid>/status.
func rssMiB(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, err := strconv.ParseFloat(f[1], 64)
				return kb / 1024, err
			}
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}

// cpuSeconds reads utime+stime from /proc/<pid>/stat.
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	const clkTck = 100 // USER_HZ on Linux
	return (ut + st) / clkTck, nil
}

// noResources waits until the devicemanager lists no resource.
func (r *runner) noResources(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := r.dm.ListResources(lctx, &dmv1.ListResourcesRequest{})
		cancel()
		if err == nil && len(resp.GetResources()) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("resources still listed after the plugins left: %d (%v)", len(resp.GetResources()), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
