package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"

	"github.com/nodeplug/nodeplug/pkg/layout"
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
			res, err := r.allocRun(ctx, func(int, int) string { return dp.Resource() }, devices, callers, r.cfg.AllocDuration, nil)
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

// allocRun runs Allocate/Release pairs from callers for d; caller c's
// i-th pair allocates one device of resource(c, i). tick, when set, is
// called every 100 ms while it runs.
func (r *runner) allocRun(ctx context.Context, resource func(c, i int) string, devices, callers int, d time.Duration, tick func()) (AllocationResult, error) {
	r.logf("allocation: %d devices, %d callers, %v", devices, callers, d)
	out := AllocationResult{Devices: devices, Callers: callers}
	var mu sync.Mutex
	var allocs, releases []time.Duration
	var firstErr error
	deadline := time.Now().Add(d)
	start := time.Now()
	if tick != nil {
		tctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-tctx.Done():
					return
				case <-t.C:
					tick()
				}
			}
		}()
	}
	var wg sync.WaitGroup
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				pod := fmt.Sprintf("bench-%d-%d-%d", devices, c, i)
				t0 := time.Now()
				_, err := r.dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: pod, ContainerName: "c",
					Resources: []*dmv1.ResourceRequest{{ResourceName: resource(c, i), Count: 1}}})
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

// DurabilityResult is what making allocations durable costs: Allocate
// beside the fsync floor, Allocate with many plugins registered, and the
// journal's size under a long Allocate/Release loop.
type DurabilityResult struct {
	// FsyncFloor: one small append plus fdatasync on the checkpoint's
	// filesystem, in this run, for as long as Allocate8 runs (before
	// 2026-12-01: 500 of them, about a tenth of a second).
	FsyncFloor Dist `json:"fsync_floor"`
	// FsyncOverwriteFloor: the same record written over zeros already
	// synced, plus fdatasync, alternating with FsyncFloor's appends: no
	// metadata to commit, as in the preallocated journal; the least the
	// journal itself can pay. OverOverwriteFloorP99Ms is Allocate8's p99
	// less its p99.
	FsyncOverwriteFloor     Dist    `json:"fsync_floor_overwrite"`
	OverOverwriteFloorP99Ms float64 `json:"allocate_p99_over_overwrite_floor_p99_ms"`
	// FsyncPacedFloor: FsyncFloor's append and fdatasync with a pause
	// after each, as the devicemanager's writes for one caller come, for
	// as long as FsyncFloor; what one durable append costs when the CPU
	// sleeps between writes. OverPacedFloorP99Ms is Allocate8's p99 less
	// its p99.
	FsyncPacedFloor     Dist    `json:"fsync_floor_paced"`
	OverPacedFloorP99Ms float64 `json:"allocate_p99_over_paced_floor_p99_ms"`
	// Allocate8 is Allocate with 8 devices and one caller, measured right
	// after the floor; OverFloorP99Ms its p99 less the floor's (target:
	// at most 1 ms).
	Allocate8      AllocationResult `json:"allocate_8_devices"`
	OverFloorP99Ms float64          `json:"allocate_p99_over_floor_p99_ms"`
	// Many is Allocate/Release pairs from 8 callers with Plugins device
	// plugins registered, each caller taking turns over its share of them;
	// ManyP99Ratio its Allocate p99 over Allocate8's (target: at most 2).
	Plugins      int              `json:"plugins_registered"`
	Many         AllocationResult `json:"many_plugins"`
	ManyP99Ratio float64          `json:"many_plugins_p99_over_8_devices_p99"`
	// Allocate8Many is Allocate with the 8 devices of Allocate8 from as
	// many callers as Many, each on a device of its own;
	// ManyP99RatioSameCallers is Many's p99 over its p99: what the node's
	// size costs, with the queueing of 8 callers on the same cores in
	// both figures.
	Allocate8Many           AllocationResult `json:"allocate_8_devices_same_callers"`
	ManyP99RatioSameCallers float64          `json:"many_plugins_p99_over_8_devices_same_callers_p99"`
	// ManyCPUPerPairUs is the devicemanager's CPU time per pair in that
	// run, in microseconds: what a pair costs whatever else the machine
	// is doing.
	ManyCPUPerPairUs float64 `json:"many_plugins_devicemanager_cpu_us_per_pair"`
	// Loop follows the checkpoint files under a longer loop.
	Loop JournalLoop `json:"journal_loop"`
}

// JournalLoop is the checkpoint's files sampled every 100 ms while
// Allocate/Release pairs run.
type JournalLoop struct {
	Seconds float64 `json:"seconds"`
	Pairs   int     `json:"pairs"`
	// PairsPerSec and Allocate are the loop's own figures: the same 8
	// callers over the same plugins as Many, but over the whole loop
	// rather than the short run right after the plugins registered.
	PairsPerSec float64 `json:"pairs_per_sec"`
	Allocate    Dist    `json:"allocate"`
	// The journal files' total size: the largest sampled, and at the end.
	MaxJournalBytes   int64 `json:"max_journal_bytes"`
	FinalJournalBytes int64 `json:"final_journal_bytes"`
	SnapshotBytes     int64 `json:"snapshot_bytes"`
	// Journals is how many journal files were seen (compactions + 1).
	Journals int `json:"journals_seen"`
}

// manyCallers is the number of callers of the many-plugins figure.
const manyCallers = 8

// durability measures what making allocations durable costs: the fsync
// floors, Allocate beside them, Allocate with cfg.AllocPlugins plugins
// registered, and the journal's size under a cfg.JournalLoop loop.
func (r *runner) durability(ctx context.Context) (DurabilityResult, error) {
	var out DurabilityResult
	r.logf("durability: fsync floor, Allocate beside it, %d plugins, journal loop %v", r.cfg.AllocPlugins, r.cfg.JournalLoop)
	fl, err := r.fsyncFloors(500, r.cfg.AllocDuration)
	if err != nil {
		return out, err
	}
	out.FsyncFloor, out.FsyncOverwriteFloor, out.FsyncPacedFloor = fl.append, fl.overwrite, fl.paced
	r.logf("  fsync floor %v\n  over zeros  %v\n  paced       %v", out.FsyncFloor, out.FsyncOverwriteFloor, out.FsyncPacedFloor)
	dp, err := r.eightDevices(ctx, &out)
	if err != nil {
		return out, err
	}
	defer dp.Stop()

	// Many plugins, two devices each.
	out.Plugins = r.cfg.AllocPlugins
	plugins, err := r.startManyPlugins(ctx, out.Plugins)
	if err != nil {
		return out, err
	}
	defer stopManyPlugins(plugins)
	spread := spreadOver(plugins)
	if err := r.manyPlugins(ctx, &out, spread); err != nil {
		return out, err
	}

	// The longer loop, following the files.
	loop, err := r.journalLoop(ctx, spread)
	if err != nil {
		return out, err
	}
	out.Loop = loop
	r.logf("  allocate p99 %.3f ms over the floor's; %d plugins: %.0f pairs/s, p99 %.2f× the 8-device one; loop of %d pairs: journal ≤ %d bytes (%d files seen), snapshot %d bytes",
		out.OverFloorP99Ms, out.Plugins, out.Many.PairsPerSec, out.ManyP99Ratio, out.Loop.Pairs, out.Loop.MaxJournalBytes, out.Loop.Journals, out.Loop.SnapshotBytes)
	return out, nil
}

// eightDevices starts a plugin of 8 devices and fills out's Allocate8
// figures (one caller, beside the floors already in out) and
// Allocate8Many (manyCallers callers). It returns the plugin, still
// registered, for the caller to stop; on an error after it started, it
// stops it itself.
func (r *runner) eightDevices(ctx context.Context, out *DurabilityResult) (*devicePlugin, error) {
	dp, err := r.newDevicePlugin("bench.example.com/durable8", 8)
	if err != nil {
		return nil, err
	}
	ready := r.res.wait(dp.Resource(), allocatable(8))
	if err := dp.start(); err != nil {
		return nil, err
	}
	resource := func(int, int) string { return dp.Resource() }
	if _, err := waitTime(ctx, ready, dp.Resource()+" allocatable"); err != nil {
		dp.Stop()
		return nil, err
	}
	if out.Allocate8, err = r.allocRun(ctx, resource, 8, 1, r.cfg.AllocDuration, nil); err != nil {
		dp.Stop()
		return nil, err
	}
	out.OverFloorP99Ms = round2(out.Allocate8.Allocate.P99 - out.FsyncFloor.P99)
	out.OverOverwriteFloorP99Ms = round2(out.Allocate8.Allocate.P99 - out.FsyncOverwriteFloor.P99)
	out.OverPacedFloorP99Ms = round2(out.Allocate8.Allocate.P99 - out.FsyncPacedFloor.P99)
	if out.Allocate8Many, err = r.allocRun(ctx, resource, 8, manyCallers, r.cfg.AllocDuration, nil); err != nil {
		dp.Stop()
		return nil, err
	}
	return dp, nil
}

// startManyPlugins starts n device plugins of two devices each and waits
// until all are allocatable. On an error it stops those it started.
func (r *runner) startManyPlugins(ctx context.Context, n int) ([]*devicePlugin, error) {
	plugins := make([]*devicePlugin, 0, n)
	readies := make([]<-chan time.Time, 0, n)
	for i := range n {
		p, err := r.newDevicePlugin(fmt.Sprintf("bench.example.com/many%d", i), 2)
		if err != nil {
			stopManyPlugins(plugins)
			return nil, err
		}
		readies = append(readies, r.res.wait(p.Resource(), allocatable(2)))
		if err := p.start(); err != nil {
			stopManyPlugins(plugins)
			return nil, err
		}
		plugins = append(plugins, p)
	}
	for i, ch := range readies {
		if _, err := waitTime(ctx, ch, plugins[i].Resource()+" allocatable"); err != nil {
			stopManyPlugins(plugins)
			return nil, err
		}
	}
	return plugins, nil
}

// stopManyPlugins removes the plugins' sockets from plugins_registry, then
// stops them.
func stopManyPlugins(plugins []*devicePlugin) {
	for _, p := range plugins {
		_ = os.Remove(p.final)
	}
	for _, p := range plugins {
		p.Stop()
	}
}

// spreadOver is the resource of caller c's i-th pair over plugins: caller
// c takes turns over the plugins whose index is c modulo manyCallers, so
// that callers never wait for each other's devices.
func spreadOver(plugins []*devicePlugin) func(c, i int) string {
	return func(c, i int) string {
		n := (len(plugins) - c + manyCallers - 1) / manyCallers
		return plugins[c+manyCallers*(i%n)].Resource()
	}
}

// manyPlugins fills out's Many figures: Allocate/Release pairs from
// manyCallers callers over the plugins spread gives, their devicemanager
// CPU per pair, and their p99 beside the 8-device ones already in out.
func (r *runner) manyPlugins(ctx context.Context, out *DurabilityResult, spread func(c, i int) string) error {
	cpu0 := r.cpuByService()["devicemanager"]
	var err error
	if out.Many, err = r.allocRun(ctx, spread, 2, manyCallers, r.cfg.AllocDuration, nil); err != nil {
		return err
	}
	if out.Many.Pairs > 0 {
		out.ManyCPUPerPairUs = round2((r.cpuByService()["devicemanager"] - cpu0) * 1e6 / float64(out.Many.Pairs))
	}
	if p99 := out.Allocate8.Allocate.P99; p99 > 0 {
		out.ManyP99Ratio = round2(out.Many.Allocate.P99 / p99)
	}
	if p99 := out.Allocate8Many.Allocate.P99; p99 > 0 {
		out.ManyP99RatioSameCallers = round2(out.Many.Allocate.P99 / p99)
	}
	return nil
}

// journalLoop runs Allocate/Release pairs from manyCallers callers over
// the plugins spread gives for cfg.JournalLoop, sampling the checkpoint's
// journal files every 100 ms.
func (r *runner) journalLoop(ctx context.Context, spread func(c, i int) string) (JournalLoop, error) {
	js := &journalSampler{dir: layout.DevicePluginsDir(r.root), seen: map[string]bool{}}
	loop, err := r.allocRun(ctx, spread, 2, manyCallers, r.cfg.JournalLoop, js.tick)
	if err != nil {
		return JournalLoop{}, err
	}
	js.mu.Lock()
	out := JournalLoop{Seconds: r.cfg.JournalLoop.Seconds(), Pairs: loop.Pairs, PairsPerSec: loop.PairsPerSec, Allocate: loop.Allocate, FinalJournalBytes: js.size()}
	out.MaxJournalBytes = max(js.largest, out.FinalJournalBytes)
	out.Journals = len(js.seen)
	js.mu.Unlock()
	if fi, err := os.Stat(filepath.Join(js.dir, layout.CheckpointFileName)); err == nil {
		out.SnapshotBytes = fi.Size()
	}
	return out, nil
}

// journalSampler follows the total size of the checkpoint's journal files
// in dir. Its methods are safe for concurrent use as documented.
type journalSampler struct {
	dir     string
	mu      sync.Mutex      // guards seen and largest, and serializes size
	seen    map[string]bool // the journal file names seen
	largest int64           // the largest total tick sampled
}

// size is the journal files' total size now; it records their names in
// seen. The caller holds mu.
func (s *journalSampler) size() int64 {
	js, _ := filepath.Glob(filepath.Join(s.dir, layout.CheckpointFileName+layout.CheckpointJournalInfix+"*"))
	var total int64
	for _, j := range js {
		if fi, err := os.Stat(j); err == nil {
			total += fi.Size()
			s.seen[filepath.Base(j)] = true
		}
	}
	return total
}

// tick samples the total size and keeps the largest; it takes mu.
func (s *journalSampler) tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.largest = max(s.largest, s.size())
}

// printDurability writes the durability figures.
func printDurability(w io.Writer, d DurabilityResult) {
	fmt.Fprintln(w, "\nDurability (the checkpoint journal: one append + fdatasync per change, shared by concurrent changes)")
	fmt.Fprintf(w, "  fsync floor (256-byte append + fdatasync)  %s\n", d.FsyncFloor)
	fmt.Fprintf(w, "  the same written over synced zeros         %s\n", d.FsyncOverwriteFloor)
	fmt.Fprintf(w, "  %-43s%s\n", fmt.Sprintf("the append, paced: %v pause after each", pacedFloorPause), d.FsyncPacedFloor)
	fmt.Fprintf(w, "  Allocate, 8 devices, 1 caller              %s\n", d.Allocate8.Allocate)
	fmt.Fprintf(w, "  Allocate p99 − floor p99: %.3f ms (target ≤ 1 ms); − the overwrite floor's p99 (what the preallocated journal pays): %.3f ms\n",
		d.OverFloorP99Ms, d.OverOverwriteFloorP99Ms)
	fmt.Fprintf(w, "  Allocate p99 − the paced floor's p99 (one durable append when the CPU sleeps between writes, as between Allocate's): %.3f ms\n",
		d.OverPacedFloorP99Ms)
	fmt.Fprintf(w, "  %d plugins registered, %d callers: %.0f pairs/s (target ≥ %d/s), allocate %s\n",
		d.Plugins, d.Many.Callers, d.Many.PairsPerSec, 5*219, d.Many.Allocate)
	fmt.Fprintf(w, "  its p99 is %.2f× the 8-device p99 (target ≤ 2×); devicemanager CPU %.0f µs per pair\n", d.ManyP99Ratio, d.ManyCPUPerPairUs)
	fmt.Fprintf(w, "  Allocate, 8 devices, %d callers             %s\n", d.Allocate8Many.Callers, d.Allocate8Many.Allocate)
	fmt.Fprintf(w, "  the %d plugins' p99 is %.2f× that (the same callers; the size of the node alone)\n", d.Plugins, d.ManyP99RatioSameCallers)
	fmt.Fprintf(w, "  loop of %.0f s, %d pairs (%.0f/s), allocate %s\n", d.Loop.Seconds, d.Loop.Pairs, d.Loop.PairsPerSec, d.Loop.Allocate)
	fmt.Fprintf(w, "  the loop's journal: at most %d bytes, %d at the end; %d journal files seen; snapshot %d bytes\n",
		d.Loop.MaxJournalBytes, d.Loop.FinalJournalBytes, d.Loop.Journals, d.Loop.SnapshotBytes)
}
