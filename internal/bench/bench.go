package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/stack"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
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
	AllocPlugins   int           // plugins registered for the many-plugins Allocate figure
	JournalLoop    time.Duration // Allocate/Release loop during which the journal's size is followed
	Flips          int           // health flips for the propagation figure
	FlipDevices    int           // devices of the flipping plugin
	IdlePlugins    int           // registration-only plugins for the idle figures
	IdleWindow     time.Duration // how long idle CPU is sampled
	RSSPlugins     int           // device plugins for the devicemanager's per-plugin RSS
	StaleSockets   int           // stale socket files beside which a healthy plugin registers
	StaleSamples   int           // healthy registrations measured, quiet and beside them
	FloorRounds    int           // rounds of nodeplug and the floor per kind and N (median taken)
	// FloorKinds are the plugin kinds of the floor phase, of Kinds (nil:
	// all of them).
	FloorKinds   []string
	ClaimCallers []int // concurrent callers of DRA claim prepare+release pairs (claims.go)
	ClaimPairs   int   // pairs per caller, each on a new claim
	// KubeletHarness, when set, is the kubeletreg binary: the floor
	// phase's rounds then measure the kubelet's own plugin manager too
	// (kubelet.go). It needs root.
	KubeletHarness string
	// HarnessGCPercent is the bench process's own GC percent while the
	// allocation and durability phases run (0: Go's default). Their
	// callers and in-process plugins live in the bench process, and its
	// collections, on the same two cores, would be counted as the
	// devicemanager's latency. The services keep their own settings.
	HarnessGCPercent int
	// APITCP, when set, puts the bench's own API calls on TCP with
	// mutual TLS (-api-tcp); nil keeps them on the Unix API sockets.
	APITCP *APITCP
	// Phases to run, by name (see Phases); all when empty.
	Phases []string
	// PprofDir, when set, receives a CPU profile of each service taken
	// over the first PprofSeconds (default 20) of the phases after
	// footprint.
	PprofDir     string
	PprofSeconds int
	Progress     io.Writer // progress lines; nil discards
}

// Phases names the bench's phases in the order they run.
var Phases = []string{"footprint", "registration", "floor", "stale", "churn", "allocation", "durability", "propagation", "claims"}

// runs reports whether phase is selected.
func (c Config) runs(phase string) bool {
	return len(c.Phases) == 0 || slices.Contains(c.Phases, phase)
}

// CheckPhases returns an error naming the first unknown phase in phases.
func CheckPhases(phases []string) error {
	for _, p := range phases {
		if !slices.Contains(Phases, p) {
			return fmt.Errorf("unknown phase %q (phases: %s)", p, strings.Join(Phases, ", "))
		}
	}
	return nil
}

// Default is the full run; Short is the quick run `make test` uses.
func Default() Config {
	return Config{
		RegistrationNs: []int{1, 10, 100, 1000},
		ChurnDuration:  10 * time.Second, ChurnWorkers: 8, ChurnResident: 50,
		AllocDuration: 5 * time.Second, AllocDevices: []int{8, 10000}, AllocCallers: []int{1, 8},
		AllocPlugins: 1000, JournalLoop: time.Minute,
		Flips: 50, FlipDevices: 10000,
		IdlePlugins: 1000, IdleWindow: 10 * time.Second, RSSPlugins: 1000,
		StaleSockets: 1000, StaleSamples: 20, FloorRounds: 10,
		ClaimCallers: []int{1, 8}, ClaimPairs: 100,
		HarnessGCPercent: DefaultHarnessGCPercent,
	}
}

// DefaultHarnessGCPercent is Config.HarnessGCPercent by default: a
// collection per 20× the live heap allocated, which keeps the bench's own
// collector out of the allocation figures at a few hundred MB of heap.
const DefaultHarnessGCPercent = 2000

// Short is a quick run that still produces every figure.
func Short() Config {
	return Config{
		RegistrationNs: []int{1, 10},
		ChurnDuration:  time.Second, ChurnWorkers: 2, ChurnResident: 5,
		AllocDuration: 300 * time.Millisecond, AllocDevices: []int{8, 10000}, AllocCallers: []int{1, 8},
		AllocPlugins: 10, JournalLoop: time.Second,
		Flips: 3, FlipDevices: 10000,
		IdlePlugins: 20, IdleWindow: time.Second, RSSPlugins: 10,
		StaleSockets: 100, StaleSamples: 3, FloorRounds: 1,
		ClaimCallers: []int{1, 8}, ClaimPairs: 3,
		HarnessGCPercent: DefaultHarnessGCPercent,
	}
}

// Results holds every figure.
type Results struct {
	Machine      Machine              `json:"machine"`
	Registration []RegistrationResult `json:"registration"`
	Stale        StaleResult          `json:"registration_beside_stale"`
	// Floor compares nodeplug's registration with the least any registrar
	// can do, per kind of plugin and N.
	Floor       []FloorResult      `json:"registration_floor"`
	Churn       ChurnResult        `json:"churn"`
	Allocation  []AllocationResult `json:"allocation"`
	Durability  DurabilityResult   `json:"durability"`
	Propagation PropagationResult  `json:"propagation"`
	Footprint   FootprintResult    `json:"footprint"`
	Claims      []ClaimsResult     `json:"dra_claims"`
	// Ratios are the run's figures as ratios, lower is better, by name
	// (see ComputeRatios): what a baseline records and a run is compared
	// with.
	Ratios map[string]float64 `json:"ratios,omitempty"`
	// Command is the command line of the run, as the figures page shows
	// it: what a baseline of several runs says it was made of.
	Command string `json:"command,omitempty"`
}

// Machine describes where the figures were taken.
type Machine struct {
	CPUs int `json:"cpus"`
	// CPUModel is the processor's name (ReadCPU), "" when unknown.
	CPUModel string `json:"cpu_model,omitempty"`
	// CPUID is the processor's vendor, family, model and stepping
	// (ReadCPU), "" when unknown: virtual machines of two processor
	// generations, one much faster than the other, both call theirs
	// "AMD EPYC".
	CPUID     string `json:"cpu_id,omitempty"`
	GoVersion string `json:"go_version"`
	Time      string `json:"time"`
	// API is how the bench reached the services' APIs: "unix" (the API
	// sockets), "tcp+mtls" (-api-tcp) or "tcp" (-api-tcp -insecure-tcp).
	API string `json:"api"`
	// HarnessGCPercent is the bench process's GC percent during the
	// allocation and durability phases (0: Go's default; see Config).
	HarnessGCPercent int `json:"harness_gc_percent_allocation_phases"`
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
	// The devicemanager's VmRSS at the start of the phase, before any
	// plugin registered, and its RssAnon and RssFile parts (see rssSample:
	// RssAnon is what the process itself holds, RssFile mostly its own
	// executable's pages, which depend on the kernel and the page cache).
	DeviceManagerStartMiB     float64 `json:"devicemanager_start_rss_mib"`
	DeviceManagerStartAnonMiB float64 `json:"devicemanager_start_rss_anon_mib"`
	DeviceManagerStartFileMiB float64 `json:"devicemanager_start_rss_file_mib"`

	IdlePlugins    int                `json:"idle_plugins"`
	RSSMiB         map[string]float64 `json:"rss_mib"`
	IdleCPUPercent map[string]float64 `json:"idle_cpu_percent_of_a_core"`
	// The devicemanager's RSS before and after RSSPlugins device plugins.
	DeviceManagerPlugins   int     `json:"devicemanager_device_plugins"`
	DeviceManagerBaseMiB   float64 `json:"devicemanager_base_rss_mib"`
	DeviceManagerLoadedMiB float64 `json:"devicemanager_loaded_rss_mib"`
	DeviceManagerPerPlugin float64 `json:"devicemanager_rss_kib_per_plugin"`
	// The RssAnon and RssFile parts of DeviceManagerBaseMiB.
	DeviceManagerBaseAnonMiB float64 `json:"devicemanager_base_rss_anon_mib"`
	DeviceManagerBaseFileMiB float64 `json:"devicemanager_base_rss_file_mib"`
	// A bare grpc-go client with one ListAndWatch stream per plugin, on
	// the same plugins, and the devicemanager's figure over its.
	Bare                  BareResult `json:"bare_grpc_client"`
	DeviceManagerOverBare float64    `json:"devicemanager_over_bare"`
	// The devicemanager's RSS once those plugins left and their resources
	// were forgotten, and its ratio to the RSS before them.
	DeviceManagerAfterMiB      float64 `json:"devicemanager_after_rss_mib"`
	DeviceManagerAfterOverBase float64 `json:"devicemanager_after_over_base"`
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
	// unfollow ends the Watch streams res and plugs follow; it does
	// nothing before follow.
	unfollow context.CancelFunc
	seq      atomic.Int64
}

func (r *runner) logf(format string, args ...any) {
	if r.cfg.Progress != nil {
		fmt.Fprintf(r.cfg.Progress, format+"\n", args...)
	}
}

// Run starts the services, measures everything and stops them.
func Run(ctx context.Context, cfg Config) (*Results, error) {
	var undo cleanups
	defer undo.run()
	r, err := start(ctx, cfg, &undo)
	if err != nil {
		return nil, err
	}
	res, err := r.measure(ctx)
	if err != nil {
		return nil, err
	}
	res.Ratios = ComputeRatios(res)
	return res, nil
}

// cleanups are what undoes the setup, run last added first, as defers
// would be.
type cleanups []func()

// add appends f to what run calls.
func (c *cleanups) add(f func()) { *c = append(*c, f) }

// run calls every cleanup, the last added first.
func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// start makes the root dir when cfg has none, starts the services, dials
// their APIs and follows their Watch streams until they sync. What it
// set up is undone by undo, also when it fails part way.
func start(ctx context.Context, cfg Config, undo *cleanups) (*runner, error) {
	root := cfg.Root
	if root == "" {
		var err error
		if root, err = os.MkdirTemp("", "npbench"); err != nil {
			return nil, err
		}
		undo.add(func() { _ = os.RemoveAll(root) })
	}
	st := stack.NewProcesses(cfg.Bin, root, append([]string{"NODEPLUG_DEVICEMANAGER_GRACE_PERIOD=1s"}, pprofEnv(cfg)...)...)
	// The bench's own API calls go to the API sockets, or with -api-tcp to
	// each service's TCP port over mutual TLS.
	client, addr := &app.TLS{}, st.Addr
	if cfg.APITCP != nil {
		var err error
		if st.Args, client, err = cfg.APITCP.setup(root); err != nil {
			return nil, fmt.Errorf("-api-tcp: %w", err)
		}
		addr = st.TCPAddr
	}
	undo.add(st.StopAll)
	if err := st.StartAll(ctx); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, root: root, st: st, unfollow: func() {}}
	if err := r.dial(client, addr, undo); err != nil {
		return nil, err
	}
	// The streams followed at the end (the floor phase ends them and
	// follows anew) are ended with the rest.
	undo.add(func() { r.unfollow() })
	if err := r.follow(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// dial connects r's API clients to the devicemanager and the reconciler
// at addr; undo closes the connections.
func (r *runner) dial(client *app.TLS, addr func(string) string, undo *cleanups) error {
	dmConn, err := client.Dial(addr("devicemanager"), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return err
	}
	undo.add(func() { _ = dmConn.Close() })
	rcConn, err := client.Dial(addr("reconciler"), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		return err
	}
	undo.add(func() { _ = rcConn.Close() })
	r.dm, r.rc = dmv1.NewDeviceManagerServiceClient(dmConn), rcv1.NewReconcilerServiceClient(rcConn)
	if r.cfg.APITCP != nil {
		r.logf("API over %s: devicemanager %s, reconciler %s", r.cfg.APITCP.transport(), addr("devicemanager"), addr("reconciler"))
	}
	return nil
}

// follow checks the APIs answer, then follows the devicemanager's
// resources and the reconciler's plugins until both Watch streams have
// synced; unfollow ends the streams, and follow again opens new ones.
func (r *runner) follow(ctx context.Context) error {
	fctx, cancel := context.WithCancel(ctx)
	r.unfollow = cancel
	// A refused handshake or a missing role would otherwise only show as
	// Watch streams that never sync (they resubscribe quietly).
	if err := r.reachable(ctx); err != nil {
		return err
	}
	r.res = followResources(fctx, r.dm)
	r.plugs = followPlugins(fctx, r.rc)
	for _, f := range []chan struct{}{r.res.synced, r.plugs.synced} {
		select {
		case <-f:
		case <-time.After(30 * time.Second):
			return errors.New("the Watch streams did not sync")
		}
	}
	return nil
}

// measure runs the selected phases in order, footprint first, and
// returns their figures.
func (r *runner) measure(ctx context.Context) (*Results, error) {
	cfg := r.cfg
	cpuModel, cpuID := ReadCPU()
	res := &Results{Machine: Machine{CPUs: runtime.NumCPU(), CPUModel: cpuModel, CPUID: cpuID, GoVersion: runtime.Version(), Time: time.Now().UTC().Format(time.RFC3339),
		API: cfg.APITCP.transport(), HarnessGCPercent: cfg.HarnessGCPercent}}
	// Footprint first, on fresh processes: the heap the later phases grow
	// (10,000-device updates, churn) is returned to the OS only slowly and
	// would be counted as footprint.
	if cfg.runs("footprint") {
		var err error
		if res.Footprint, err = r.footprint(ctx); err != nil {
			return nil, fmt.Errorf("footprint: %w", err)
		}
		if err := r.quiesce(ctx); err != nil {
			return nil, err
		}
	}
	profiled := r.profiles(ctx)
	if err := r.measureRegistration(ctx, res); err != nil {
		return nil, err
	}
	if err := r.measureLoad(ctx, res); err != nil {
		return nil, err
	}
	if err := profiled(); err != nil {
		return nil, fmt.Errorf("profiles: %w", err)
	}
	return res, nil
}

// measureRegistration runs the selected phases about registration
// (registration, floor, stale and churn) into res.
func (r *runner) measureRegistration(ctx context.Context, res *Results) (err error) {
	cfg := r.cfg
	if cfg.runs("registration") {
		for _, n := range cfg.RegistrationNs {
			rr, err := r.registration(ctx, n)
			if err != nil {
				return fmt.Errorf("registration N=%d: %w", n, err)
			}
			res.Registration = append(res.Registration, rr)
		}
	}
	if cfg.runs("floor") {
		if res.Floor, err = r.floor(ctx); err != nil {
			return fmt.Errorf("registration at the floor: %w", err)
		}
	}
	if cfg.runs("stale") {
		if res.Stale, err = r.stale(ctx); err != nil {
			return fmt.Errorf("registration beside stale sockets: %w", err)
		}
	}
	if cfg.runs("churn") {
		if res.Churn, err = r.churn(ctx); err != nil {
			return fmt.Errorf("churn: %w", err)
		}
	}
	return nil
}

// measureLoad runs the selected phases under allocation and update load
// (allocation, durability, propagation and claims) into res; the first
// two with the bench's own GC percent set to cfg.HarnessGCPercent.
func (r *runner) measureLoad(ctx context.Context, res *Results) (err error) {
	cfg := r.cfg
	if cfg.runs("allocation") {
		restore := harnessGC(cfg.HarnessGCPercent)
		res.Allocation, err = r.allocation(ctx)
		restore()
		if err != nil {
			return fmt.Errorf("allocation: %w", err)
		}
	}
	if cfg.runs("durability") {
		restore := harnessGC(cfg.HarnessGCPercent)
		res.Durability, err = r.durability(ctx)
		restore()
		if err != nil {
			return fmt.Errorf("durability: %w", err)
		}
	}
	if cfg.runs("propagation") {
		if res.Propagation, err = r.propagation(ctx); err != nil {
			return fmt.Errorf("propagation: %w", err)
		}
	}
	if cfg.runs("claims") {
		if res.Claims, err = r.claims(ctx); err != nil {
			return fmt.Errorf("DRA claims: %w", err)
		}
	}
	return nil
}

// harnessGC sets the bench process's GC percent to percent (0: leaves it)
// and returns what puts the previous one back.
func harnessGC(percent int) (restore func()) {
	if percent == 0 {
		return func() {}
	}
	old := debug.SetGCPercent(percent)
	return func() {
		debug.SetGCPercent(old)
		runtime.GC()
	}
}

// reachable makes one call to each API the bench uses, so that a
// connection or access problem fails the run at once, with its cause.
func (r *runner) reachable(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := r.dm.ListResources(cctx, &dmv1.ListResourcesRequest{}); err != nil {
		return fmt.Errorf("devicemanager API: %w", err)
	}
	if _, err := r.rc.ListPlugins(cctx, &rcv1.ListPluginsRequest{}); err != nil {
		return fmt.Errorf("reconciler API: %w", err)
	}
	return nil
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
	return filepath.Join(layout.PluginsRegistryDir(r.root), fmt.Sprintf("%s-%d.sock", prefix, r.seq.Add(1)))
}

// devicePlugin is a device plugin that records when its socket appeared.
type devicePlugin struct {
	*sampleplugin.Plugin
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
	p, err := sampleplugin.New(sampleplugin.Options{
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
