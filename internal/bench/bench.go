package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/stack"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/deviceplugin"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
)

// Config says what to measure and how hard.
type Config struct {
	Bin            string        // directory with the service binaries
	Root           string        // root dir; a temporary one when empty
	RegistrationNs []int         // plugins created at once, per round
	ChurnDuration  time.Duration // how long the churn runs
	ChurnWorkers   int
	ChurnResident  int           // plugins that stay registered during churn
	AllocDuration  time.Duration // per allocation run
	AllocDevices   []int         // devices per plugin
	AllocCallers   []int         // concurrent callers
	Flips          int           // health flips for the propagation figure
	FlipDevices    int           // devices of the flipping plugin
	IdlePlugins    int           // registration-only plugins for the idle figures
	IdleWindow     time.Duration // how long idle CPU is sampled
	RSSPlugins     int           // device plugins for the devicemanager's per-plugin RSS
	StaleSockets   int           // stale socket files beside which a healthy plugin registers
	StaleSamples   int           // healthy registrations measured, quiet and beside them
	Progress       io.Writer     // progress lines; nil discards
}

// Default is the full run; Short is the quick run `make test` uses.
func Default() Config {
	return Config{
		RegistrationNs: []int{1, 10, 100, 1000},
		ChurnDuration:  10 * time.Second, ChurnWorkers: 8, ChurnResident: 50,
		AllocDuration: 5 * time.Second, AllocDevices: []int{8, 10000}, AllocCallers: []int{1, 8},
		Flips: 50, FlipDevices: 10000,
		IdlePlugins: 1000, IdleWindow: 10 * time.Second, RSSPlugins: 1000,
		StaleSockets: 1000, StaleSamples: 20,
	}
}

// Short is a quick run that still produces every figure.
func Short() Config {
	return Config{
		RegistrationNs: []int{1, 10},
		ChurnDuration:  time.Second, ChurnWorkers: 2, ChurnResident: 5,
		AllocDuration: 300 * time.Millisecond, AllocDevices: []int{8, 10000}, AllocCallers: []int{1, 8},
		Flips: 3, FlipDevices: 10000,
		IdlePlugins: 20, IdleWindow: time.Second, RSSPlugins: 10,
		StaleSockets: 100, StaleSamples: 3,
	}
}

// Results holds every figure.
type Results struct {
	Machine      Machine              `json:"machine"`
	Registration []RegistrationResult `json:"registration"`
	Stale        StaleResult          `json:"registration_beside_stale"`
	Churn        ChurnResult          `json:"churn"`
	Allocation   []AllocationResult   `json:"allocation"`
	Propagation  PropagationResult    `json:"propagation"`
	Footprint    FootprintResult      `json:"footprint"`
}

// Machine describes where the figures were taken.
type Machine struct {
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"go_version"`
	Time      string `json:"time"`
}

// RegistrationResult is one round of N plugins created at once.
type RegistrationResult struct {
	N int `json:"n"`
	// Socket listen → NotifyRegistrationStatus(registered=true) at the plugin.
	Notify Dist `json:"notify"`
	// Socket listen → the resource allocatable in the devicemanager.
	Allocatable Dist `json:"allocatable"`
	// First socket appeared → last plugin notified.
	AllRegisteredMs float64 `json:"all_registered_ms"`
	// First socket appeared → last socket appeared.
	AppearMs float64 `json:"appear_ms"`
	// Socket removal → the plugin gone from the reconciler.
	Deregistration Dist `json:"deregistration"`
	// CPU time each service used for the round's registrations, in ms.
	CPUms map[string]float64 `json:"cpu_ms"`
}

// ChurnResult is plugins created and removed in a loop.
type ChurnResult struct {
	Seconds      float64  `json:"seconds"`
	Workers      int      `json:"workers"`
	Cycles       int      `json:"cycles"`
	CyclesPerSec float64  `json:"cycles_per_sec"`
	Register     Dist     `json:"register"`
	Deregister   Dist     `json:"deregister"`
	Resident     int      `json:"resident"`
	FinalExact   bool     `json:"final_state_exact"`
	FinalProblem string   `json:"final_state_problem,omitempty"`
	Leftover     []string `json:"leftover,omitempty"`
}

// AllocationResult is Allocate/Release pairs against one plugin.
type AllocationResult struct {
	Devices     int     `json:"devices_per_plugin"`
	Callers     int     `json:"callers"`
	Pairs       int     `json:"pairs"`
	PairsPerSec float64 `json:"pairs_per_sec"`
	Allocate    Dist    `json:"allocate"`
	Release     Dist    `json:"release"`
}

// PropagationResult is health flips in ListAndWatch to WatchResources.
type PropagationResult struct {
	Devices int  `json:"devices"`
	Latency Dist `json:"latency"`
}

// FootprintResult is memory and idle CPU.
type FootprintResult struct {
	IdlePlugins    int                `json:"idle_plugins"`
	RSSMiB         map[string]float64 `json:"rss_mib"`
	IdleCPUPercent map[string]float64 `json:"idle_cpu_percent_of_a_core"`
	// The devicemanager's RSS before and after RSSPlugins device plugins.
	DeviceManagerPlugins   int     `json:"devicemanager_device_plugins"`
	DeviceManagerBaseMiB   float64 `json:"devicemanager_base_rss_mib"`
	DeviceManagerLoadedMiB float64 `json:"devicemanager_loaded_rss_mib"`
	DeviceManagerPerPlugin float64 `json:"devicemanager_rss_kib_per_plugin"`
}

// runner holds the live stack and its clients.
type runner struct {
	cfg   Config
	root  string
	st    *stack.Processes
	dm    dmv1.DeviceManagerServiceClient
	rc    rcv1.ReconcilerServiceClient
	res   *follower[*dmv1.Resource]
	plugs *follower[*rcv1.Plugin]
	seq   atomic.Int64
}

func (r *runner) logf(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, format+"\n", args...)
	}
}

// Run starts the services, measures everything and stops them.
func Run(ctx context.Context, cfg Config) (res *Results, err error) {
	root := cfg.Root
	if root == "" {
		root, err = os.MkdirTemp("", "npbench")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(root)
	}
	st := stack.NewProcesses(cfg.Bin, root, "NODEPLUG_DEVICEMANAGER_GRACE_PERIOD=1s")
	defer st.StopAll()
	if err := st.StartAll(ctx); err != nil {
		return nil, err
	}
	dmConn, err := rpcutil.DialPeer(st.Addr("devicemanager"), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	defer dmConn.Close()
	rcConn, err := rpcutil.DialPeer(st.Addr("reconciler"), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return nil, err
	}
	defer rcConn.Close()
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &runner{cfg: cfg, root: root, st: st, dm: dmv1.NewDeviceManagerServiceClient(dmConn), rc: rcv1.NewReconcilerServiceClient(rcConn)}
	r.res = followResources(fctx, r.dm)
	r.plugs = followPlugins(fctx, r.rc)
	for _, f := range []chan struct{}{r.res.synced, r.plugs.synced} {
		select {
		case <-f:
		case <-time.After(30 * time.Second):
			return nil, errors.New("the Watch streams did not sync")
		}
	}

	res = &Results{Machine: Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Time: time.Now().UTC().Format(time.RFC3339)}}
	// Footprint first, on fresh processes: the heap the later phases grow
	// (10,000-device updates, churn) is returned to the OS only slowly and
	// would be counted as footprint.
	if res.Footprint, err = r.footprint(ctx); err != nil {
		return nil, fmt.Errorf("footprint: %w", err)
	}
	if err := r.quiesce(ctx); err != nil {
		return nil, err
	}
	for _, n := range cfg.RegistrationNs {
		rr, err := r.registration(ctx, n)
		if err != nil {
			return nil, fmt.Errorf("registration N=%d: %w", n, err)
		}
		res.Registration = append(res.Registration, rr)
	}
	if res.Stale, err = r.stale(ctx); err != nil {
		return nil, fmt.Errorf("registration beside stale sockets: %w", err)
	}
	if res.Churn, err = r.churn(ctx); err != nil {
		return nil, fmt.Errorf("churn: %w", err)
	}
	if res.Allocation, err = r.allocation(ctx); err != nil {
		return nil, fmt.Errorf("allocation: %w", err)
	}
	if res.Propagation, err = r.propagation(ctx); err != nil {
		return nil, fmt.Errorf("propagation: %w", err)
	}
	return res, nil
}

// quiesce waits until the reconciler knows no plugin, so that one phase's
// deregistrations do not run into the next phase's figures.
func (r *runner) quiesce(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		resp, err := r.rc.ListPlugins(lctx, &rcv1.ListPluginsRequest{})
		cancel()
		if err == nil && len(resp.GetPlugins()) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("plugins still known after the footprint phase: %d (%v)", len(resp.GetPlugins()), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (r *runner) socket(prefix string) string {
	return filepath.Join(r.root, "plugins_registry", fmt.Sprintf("%s-%d.sock", prefix, r.seq.Add(1)))
}

// devicePlugin is a device plugin that records when its socket appeared.
type devicePlugin struct {
	*deviceplugin.Plugin
	final   string // its path in plugins_registry
	started time.Time
}

func (r *runner) newDevicePlugin(resource string, devices int) (*devicePlugin, error) {
	return r.newStagedDevicePlugin(resource, devices, "")
}

// newStagedDevicePlugin returns a plugin that listens in staging (when not
// empty) and is moved into plugins_registry by appear, so that many sockets
// can appear at once.
func (r *runner) newStagedDevicePlugin(resource string, devices int, staging string) (*devicePlugin, error) {
	dp := &devicePlugin{final: r.socket("dp")}
	listen := dp.final
	if staging != "" {
		listen = filepath.Join(staging, filepath.Base(dp.final))
	}
	p, err := deviceplugin.New(deviceplugin.Options{
		Resource: resource, SocketPath: listen, Endpoint: dp.final, Devices: devices,
	})
	if err != nil {
		return nil, err
	}
	dp.Plugin = p
	return dp, nil
}

func (dp *devicePlugin) start() error {
	dp.started = time.Now()
	return dp.Start()
}

// appear moves a staged plugin's listening socket into plugins_registry.
func (dp *devicePlugin) appear() error {
	dp.started = time.Now()
	return os.Rename(dp.SocketPath(), dp.final)
}

// remove deletes the plugin's socket (the moment deregistration starts) and
// stops it. It returns when the socket was removed.
func remove(path string, stop func()) time.Time {
	t := time.Now()
	_ = os.Remove(path)
	stop()
	return t
}

// registeredAt waits until the plugin is told it is registered and returns
// when that status arrived.
func registeredAt(ctx context.Context, reg *testplugin.Registration, what string) (time.Time, error) {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	st, err := reg.WaitStatus(wctx, testplugin.Registered)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s: %w", what, err)
	}
	return st.Time, nil
}

func waitTime(ctx context.Context, ch <-chan time.Time, what string) (time.Time, error) {
	select {
	case t := <-ch:
		return t, nil
	case <-ctx.Done():
		return time.Time{}, fmt.Errorf("%s: %w", what, ctx.Err())
	case <-time.After(2 * time.Minute):
		return time.Time{}, fmt.Errorf("%s: timed out", what)
	}
}

func allocatable(min int64) func(*dmv1.Resource) bool {
	return func(r *dmv1.Resource) bool { return r.GetAllocatable() >= min }
}

func (r *runner) registration(ctx context.Context, n int) (RegistrationResult, error) {
	r.logf("registration: %d device plugins at once", n)
	out := RegistrationResult{N: n}
	// The plugins listen in a staging directory first and are then renamed
	// into plugins_registry one after the other, so that N sockets appear
	// at once, as fast as the filesystem allows.
	staging := filepath.Join(r.root, fmt.Sprintf("staging-%d", n))
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return out, err
	}
	defer os.RemoveAll(staging)
	plugins := make([]*devicePlugin, n)
	ready := make([]<-chan time.Time, n)
	for i := range plugins {
		dp, err := r.newStagedDevicePlugin(fmt.Sprintf("bench.example.com/r%d-%d", n, i), 1, staging)
		if err != nil {
			return out, err
		}
		if err := dp.Start(); err != nil {
			return out, err
		}
		plugins[i] = dp
		ready[i] = r.res.wait(dp.Resource(), allocatable(1))
	}
	cpu0 := r.cpuByService()
	for _, dp := range plugins {
		if err := dp.appear(); err != nil {
			return out, err
		}
	}
	out.AppearMs = ms(plugins[n-1].started.Sub(plugins[0].started))
	var notify, alloc []time.Duration
	var last time.Time
	for i, dp := range plugins {
		t, err := registeredAt(ctx, dp.Registration, dp.Resource()+" registered")
		if err != nil {
			return out, err
		}
		notify = append(notify, t.Sub(dp.started))
		if t.After(last) {
			last = t
		}
		ta, err := waitTime(ctx, ready[i], dp.Resource()+" allocatable")
		if err != nil {
			return out, err
		}
		alloc = append(alloc, ta.Sub(dp.started))
	}
	out.CPUms = map[string]float64{}
	for s, v := range r.cpuByService() {
		out.CPUms[s] = round2((v - cpu0[s]) * 1000)
	}
	out.Notify, out.Allocatable = NewDist(notify), NewDist(alloc)
	out.AllRegisteredMs = ms(last.Sub(plugins[0].started))

	gone := make([]<-chan time.Time, n)
	for i, dp := range plugins {
		gone[i] = r.plugs.wait(dp.final, nil)
	}
	// Remove the sockets, and stop the plugins' servers only once all are
	// deregistered: stopping 1,000 servers in this process would compete
	// for the two cores with the services being measured.
	removed := make([]time.Time, n)
	for i, dp := range plugins {
		removed[i] = time.Now()
		_ = os.Remove(dp.final)
	}
	var dereg []time.Duration
	for i := range plugins {
		t, err := waitTime(ctx, gone[i], plugins[i].final+" deregistered")
		if err != nil {
			return out, err
		}
		dereg = append(dereg, t.Sub(removed[i]))
	}
	for _, dp := range plugins {
		dp.Stop()
	}
	out.Deregistration = NewDist(dereg)
	r.logf("  notify %v\n  allocatable %v\n  all registered in %.1f ms (CPU ms %v)\n  deregistration %v", out.Notify, out.Allocatable, out.AllRegisteredMs, out.CPUms, out.Deregistration)
	return out, nil
}

// draPlugin starts a registration-only DRA plugin.
func (r *runner) draPlugin(prefix string) (*testplugin.Plugin, string, error) {
	name := fmt.Sprintf("%s-%d.bench.example.com", prefix, r.seq.Add(1))
	p, err := testplugin.Start(r.socket(prefix), testplugin.Info{Type: registerapi.DRAPlugin, Name: name, Versions: []string{"v1.DRAPlugin"}})
	return p, name, err
}

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
	out.DeviceManagerBaseMiB, out.DeviceManagerLoadedMiB = round2(base), round2(loaded)
	if cfg.RSSPlugins > 0 {
		out.DeviceManagerPerPlugin = round2((loaded - base) * 1024 / float64(cfg.RSSPlugins))
	}
	r.logf("  devicemanager %.1f MiB → %.1f MiB, %.1f KiB per plugin", base, loaded, out.DeviceManagerPerPlugin)
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
