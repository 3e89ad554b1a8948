package bench

import (
	"context"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
)

// footprint measures the devicemanager's RSS before any plugin, the
// services' RSS and idle CPU with cfg.IdlePlugins registration-only
// plugins, then the devicemanager's RSS before, with and after
// cfg.RSSPlugins device plugins, beside a bare grpc-go client's.
func (r *runner) footprint(ctx context.Context) (FootprintResult, error) {
	cfg := r.cfg
	f := &footprintRun{r: r, out: FootprintResult{IdlePlugins: cfg.IdlePlugins, RSSMiB: map[string]float64{}, IdleCPUPercent: map[string]float64{}, DeviceManagerPlugins: cfg.RSSPlugins}}
	defer f.stop()
	if err := f.atStart(); err != nil {
		return f.out, err
	}
	if err := f.startIdle(ctx); err != nil {
		return f.out, err
	}
	if err := f.idleUsage(); err != nil {
		return f.out, err
	}
	if err := f.deviceManagerRSS(ctx); err != nil {
		return f.out, err
	}
	return f.out, nil
}

// footprintRun is the state the phases of the footprint figures share.
type footprintRun struct {
	r     *runner
	out   FootprintResult
	idle  []*testplugin.Plugin // the registration-only plugins
	dps   []*devicePlugin      // the device plugins of the RSS figure, until they leave
	dmPid int                  // the devicemanager's
	base  float64              // the devicemanager's RSS before the device plugins, MiB
}

// stop stops the device plugins still there, then the idle plugins.
func (f *footprintRun) stop() {
	for _, dp := range f.dps {
		dp.Stop()
	}
	for _, p := range f.idle {
		p.Stop()
	}
}

// atStart records the devicemanager's RSS before any plugin registered,
// with its anonymous and file-backed parts (see rssSample).
func (f *footprintRun) atStart() error {
	f.dmPid = f.r.st.Process("devicemanager").Cmd.Process.Pid
	s, err := readRSS(f.dmPid)
	if err != nil {
		return err
	}
	f.out.DeviceManagerStartMiB = round2(s.VmRSS)
	f.out.DeviceManagerStartAnonMiB, f.out.DeviceManagerStartFileMiB = round2(s.Anon), round2(s.File)
	f.r.logf("footprint: devicemanager before any plugin: VmRSS %.1f MiB (RssAnon %.1f, RssFile %.1f)", s.VmRSS, s.Anon, s.File)
	return nil
}

// startIdle starts cfg.IdlePlugins registration-only DRA plugins and waits
// until each registered.
func (f *footprintRun) startIdle(ctx context.Context) error {
	r := f.r
	r.logf("footprint: %d registration-only plugins, idle for %v", r.cfg.IdlePlugins, r.cfg.IdleWindow)
	for i := 0; i < r.cfg.IdlePlugins; i++ {
		p, _, err := r.draPlugin("idle")
		if err != nil {
			return err
		}
		f.idle = append(f.idle, p)
	}
	for _, p := range f.idle {
		if _, err := registeredAt(ctx, p.Registration, p.Path()+" registered"); err != nil {
			return err
		}
	}
	return nil
}

// idleUsage lets start-up work settle, then records each service's CPU
// over cfg.IdleWindow and its RSS.
func (f *footprintRun) idleUsage() error {
	r := f.r
	time.Sleep(r.cfg.IdleWindow / 2) // let start-up work settle before sampling
	before := map[string]float64{}
	for _, s := range stack.Services {
		before[s], _ = cpuSeconds(r.st.Process(s).Cmd.Process.Pid)
	}
	t0 := time.Now()
	time.Sleep(r.cfg.IdleWindow)
	elapsed := time.Since(t0).Seconds()
	for _, s := range stack.Services {
		pid := r.st.Process(s).Cmd.Process.Pid
		after, err := cpuSeconds(pid)
		if err != nil {
			return err
		}
		f.out.IdleCPUPercent[s] = round2(100 * (after - before[s]) / elapsed)
		rss, err := rssMiB(pid)
		if err != nil {
			return err
		}
		f.out.RSSMiB[s] = round2(rss)
	}
	r.logf("  rss MiB %v\n  idle cpu %% %v", f.out.RSSMiB, f.out.IdleCPUPercent)
	return nil
}

// deviceManagerRSS records the devicemanager's RSS before, with and after
// cfg.RSSPlugins device plugins, and a bare grpc-go client's beside it.
func (f *footprintRun) deviceManagerRSS(ctx context.Context) error {
	r := f.r
	r.logf("footprint: devicemanager RSS with %d device plugins", r.cfg.RSSPlugins)
	base, err := readRSS(f.dmPid)
	if err != nil {
		return err
	}
	f.base = base.VmRSS
	f.out.DeviceManagerBaseAnonMiB, f.out.DeviceManagerBaseFileMiB = round2(base.Anon), round2(base.File)
	if err := r.heapProfile(ctx, "devicemanager", "before"); err != nil {
		return err
	}
	if err := f.startDevicePlugins(ctx); err != nil {
		return err
	}
	if err := f.loaded(ctx); err != nil {
		return err
	}
	if err := f.bare(ctx); err != nil {
		return err
	}
	return f.afterLeaving(ctx)
}

// startDevicePlugins starts cfg.RSSPlugins device plugins of two devices
// each and waits until all are allocatable.
func (f *footprintRun) startDevicePlugins(ctx context.Context) error {
	r := f.r
	for i := 0; i < r.cfg.RSSPlugins; i++ {
		dp, err := r.newDevicePlugin(fmt.Sprintf("bench.example.com/rss-%d", i), 2)
		if err != nil {
			return err
		}
		f.dps = append(f.dps, dp)
	}
	for _, dp := range f.dps {
		if err := dp.start(); err != nil {
			return err
		}
	}
	for _, dp := range f.dps {
		if _, err := waitTime(ctx, r.res.wait(dp.Resource(), allocatable(2)), dp.Resource()+" allocatable"); err != nil {
			return err
		}
	}
	return nil
}

// loaded records the devicemanager's RSS with the device plugins, and
// what each costs it.
func (f *footprintRun) loaded(ctx context.Context) error {
	r := f.r
	time.Sleep(r.cfg.IdleWindow / 2)
	loaded, err := rssMiB(f.dmPid)
	if err != nil {
		return err
	}
	if err := r.heapProfile(ctx, "devicemanager", "loaded"); err != nil {
		return err
	}
	f.out.DeviceManagerBaseMiB, f.out.DeviceManagerLoadedMiB = round2(f.base), round2(loaded)
	if r.cfg.RSSPlugins > 0 {
		f.out.DeviceManagerPerPlugin = round2((loaded - f.base) * 1024 / float64(r.cfg.RSSPlugins))
	}
	r.logf("  devicemanager %.1f MiB → %.1f MiB, %.1f KiB per plugin", f.base, loaded, f.out.DeviceManagerPerPlugin)
	return nil
}

// bare records what a bare grpc-go client pays per connection to the
// device plugins, and the devicemanager's cost per plugin over it.
func (f *footprintRun) bare(ctx context.Context) error {
	r := f.r
	paths := make([]string, len(f.dps))
	for i, dp := range f.dps {
		paths[i] = dp.final
	}
	var err error
	if f.out.Bare, err = r.bareClient(ctx, paths); err != nil {
		return err
	}
	f.out.DeviceManagerOverBare = ratio(f.out.DeviceManagerPerPlugin, f.out.Bare.KiBPerConn)
	r.logf("  bare grpc-go client: %.1f KiB and %.2f goroutines per connection with one stream; devicemanager / bare %.2f (target ≤ 1.1)",
		f.out.Bare.KiBPerConn, f.out.Bare.GoroutinesPer, f.out.DeviceManagerOverBare)
	return nil
}

// afterLeaving removes the device plugins and, once the devicemanager
// forgot them (their grace period ended), records how much of the burst's
// memory it gave back.
func (f *footprintRun) afterLeaving(ctx context.Context) error {
	r := f.r
	for _, dp := range f.dps {
		remove(dp.final, dp.Stop)
	}
	f.dps = nil
	if err := r.noResources(ctx); err != nil {
		return err
	}
	time.Sleep(r.cfg.IdleWindow / 2)
	after, err := rssMiB(f.dmPid)
	if err != nil {
		return err
	}
	if err := r.heapProfile(ctx, "devicemanager", "after"); err != nil {
		return err
	}
	f.out.DeviceManagerAfterMiB = round2(after)
	f.out.DeviceManagerAfterOverBase = ratio(after, f.base)
	r.logf("  devicemanager after the plugins left: %.1f MiB (%.2f× its RSS before them; target ≤ 1.2×); the bare client after closing its connections: %.2f× its own",
		after, f.out.DeviceManagerAfterOverBase, f.out.Bare.ClosedOverBefore)
	return nil
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
	s, err := readRSS(pid)
	return s.VmRSS, err
}

// rssSample is a process's resident memory from /proc/<pid>/status, in
// MiB. VmRSS is RssAnon + RssFile + RssShmem. RssAnon is what the process
// itself holds (heap, stacks, the runtime's own mappings). RssFile is
// file-backed pages, for a Go binary mostly its own executable's text and
// rodata: shared with every process running it, reclaimable, and how much
// of it is resident depends on the kernel and the page cache (with large
// page-cache folios most of a Go binary's VmRSS is RssFile). Anon and File
// are zero on a kernel that does not report them (before Linux 4.5). Peak
// is VmHWM, the most VmRSS has been.
type rssSample struct {
	VmRSS, Anon, File, Peak float64
}

// readRSS reads pid's rssSample.
func readRSS(pid int) (rssSample, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	data, err := os.ReadFile(path)
	if err != nil {
		return rssSample{}, err
	}
	s, err := parseRSS(string(data))
	if err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// parseRSS reads the VmRSS, RssAnon, RssFile and VmHWM lines ("VmRSS:
// 1234 kB") of a /proc/<pid>/status; VmRSS must be there.
func parseRSS(status string) (rssSample, error) {
	var s rssSample
	fields := map[string]*float64{"VmRSS:": &s.VmRSS, "RssAnon:": &s.Anon, "RssFile:": &s.File, "VmHWM:": &s.Peak}
	seen := false
	for _, line := range strings.Split(status, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || fields[f[0]] == nil {
			continue
		}
		kb, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return s, fmt.Errorf("bad %s line %q: %w", f[0], line, err)
		}
		*fields[f[0]] = kb / 1024
		seen = seen || f[0] == "VmRSS:"
	}
	if !seen {
		return s, errors.New("no VmRSS line")
	}
	return s, nil
}

// cpuSeconds is the CPU time pid has used, all its threads, in seconds.
// It reads the process's CPU-time clock (clock_gettime on the clock
// clock_getcpuclockid(3) names: nanoseconds, the scheduler's own count),
// and falls back to utime+stime from /proc/<pid>/stat, which counts in
// ticks of 10 ms: a round of 100 registrations costs some 100 ms of CPU
// over five processes, which ticks would misstate by up to half.
func cpuSeconds(pid int) (float64, error) {
	if v, err := cpuClock(pid); err == nil {
		return v, nil
	}
	return cpuTicks(pid)
}

// cpuClock reads pid's process CPU-time clock. Its clock ID is the
// kernel's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED), as glibc's
// clock_getcpuclockid makes it.
func cpuClock(pid int) (float64, error) {
	const cpuClockSched = 2
	id := int32(^uint32(pid)<<3 | cpuClockSched)
	var ts unix.Timespec
	if err := unix.ClockGettime(id, &ts); err != nil {
		return 0, fmt.Errorf("CPU clock of process %d: %w", pid, err)
	}
	return float64(ts.Sec) + float64(ts.Nsec)/1e9, nil
}

// cpuTicks reads utime+stime from /proc/<pid>/stat.
func cpuTicks(pid int) (float64, error) {
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
