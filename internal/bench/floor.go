package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
)

// floorRegistrar is the least any registrar can do, in this process: fsnotify
// on its own directory; for each socket created, a fresh gRPC connection and
// GetInfo; for a device plugin, a fresh connection to its endpoint,
// GetDevicePluginOptions and ListAndWatch up to its first answer; then
// NotifyRegistrationStatus(true). No interceptors, stats handlers, spans or
// logs; no state beyond the open connections, which Close ends; no
// checkpoint.
type floorRegistrar struct {
	fsw        *fsnotify.Watcher
	done       chan struct{}
	ctx        context.Context
	stop       context.CancelFunc
	wg         sync.WaitGroup
	registered func(path string) // when set, told of each registration done
	failed     chan struct{}     // closed at the first failure

	mu    sync.Mutex
	conns []*grpc.ClientConn
	err   error
}

// newFloorRegistrar starts a floor registrar on dir; registered, when not
// nil, is called with each plugin's socket once its Notify is answered.
func newFloorRegistrar(dir string, registered func(path string)) (*floorRegistrar, error) {
	fsw, err := fsnotify.NewBufferedWatcher(4096)
	if err != nil {
		return nil, err
	}
	if err := fsw.Add(dir); err != nil {
		_ = fsw.Close()
		return nil, err
	}
	f := &floorRegistrar{fsw: fsw, done: make(chan struct{}), registered: registered, failed: make(chan struct{})}
	f.ctx, f.stop = context.WithCancel(context.Background())
	go f.run()
	return f, nil
}

func (f *floorRegistrar) run() {
	defer close(f.done)
	for {
		select {
		case ev, ok := <-f.fsw.Events:
			if !ok {
				return
			}
			if ev.Has(fsnotify.Create) {
				f.wg.Add(1)
				go func() {
					defer f.wg.Done()
					if err := f.register(ev.Name); err != nil {
						f.fail(err)
					} else if f.registered != nil {
						f.registered(ev.Name)
					}
				}()
			}
		case err, ok := <-f.fsw.Errors:
			if !ok {
				return
			}
			f.fail(err)
		}
	}
}

func (f *floorRegistrar) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err == nil {
		f.err = err
		close(f.failed)
	}
}

func floorDial(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}))
}

func (f *floorRegistrar) keep(c *grpc.ClientConn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns = append(f.conns, c)
}

// register does the plugin RPCs of one registration.
func (f *floorRegistrar) register(path string) error {
	ctx, cancel := context.WithTimeout(f.ctx, time.Minute)
	defer cancel()
	err := registerSocket(ctx, path, pluginHandlers{devicePlugin: f.devicePlugin, dra: func(_ context.Context, _ *registerapi.PluginInfo, ep string) error {
		c, err := connectDRA(ep)
		if err != nil {
			return err
		}
		f.keep(c)
		return nil
	}})
	if err != nil {
		return fmt.Errorf("floor: %w", err)
	}
	return nil
}

// devicePlugin is the floor's device plugin registration: a connection to
// the endpoint, GetDevicePluginOptions and ListAndWatch until its first
// answer.
func (f *floorRegistrar) devicePlugin(ctx context.Context, _ *registerapi.PluginInfo, ep string) error {
	dc, err := floorDial(ep)
	if err != nil {
		return err
	}
	f.keep(dc)
	client := pluginapi.NewDevicePluginClient(dc)
	if _, err := client.GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true)); err != nil {
		return fmt.Errorf("GetDevicePluginOptions %s: %w", ep, err)
	}
	// The stream lives as long as the connection.
	st, err := client.ListAndWatch(f.ctx, &pluginapi.Empty{})
	if err != nil {
		return fmt.Errorf("ListAndWatch %s: %w", ep, err)
	}
	if _, err := st.Recv(); err != nil {
		return fmt.Errorf("first ListAndWatch answer of %s: %w", ep, err)
	}
	return nil
}

// registerSocket is the registration both floors share: a fresh connection
// to the socket at path, GetInfo; for a device plugin h.devicePlugin, for a
// DRA driver h.dra, with the endpoint it names (its own socket when it names
// none); then NotifyRegistrationStatus(true).
func registerSocket(ctx context.Context, path string, h pluginHandlers) error {
	conn, err := floorDial(path)
	if err != nil {
		return err
	}
	defer conn.Close()
	reg := registerapi.NewRegistrationClient(conn)
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("GetInfo %s: %w", path, err)
	}
	ep := info.GetEndpoint()
	if ep == "" {
		ep = path
	}
	switch info.GetType() {
	case registerapi.DevicePlugin:
		err = h.devicePlugin(ctx, info, ep)
	case registerapi.DRAPlugin:
		err = h.dra(ctx, info, ep)
	}
	if err != nil {
		return err
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		return fmt.Errorf("NotifyRegistrationStatus %s: %w", path, err)
	}
	return nil
}

// pluginHandlers are what a floor does with a plugin of each type between
// GetInfo and Notify.
type pluginHandlers struct {
	devicePlugin func(ctx context.Context, info *registerapi.PluginInfo, endpoint string) error
	dra          func(ctx context.Context, info *registerapi.PluginInfo, endpoint string) error
}

// connectDRA is what any registrar does with a DRA driver, as the
// kubelet's DRA plugin manager does: a connection to its endpoint, kept,
// that starts connecting at once and is not waited for.
func connectDRA(endpoint string) (*grpc.ClientConn, error) {
	c, err := floorDial(endpoint)
	if err != nil {
		return nil, err
	}
	c.Connect()
	return c, nil
}

// Close stops watching, ends every connection and returns the first
// failure.
func (f *floorRegistrar) Close() error {
	err := f.fsw.Close()
	<-f.done
	f.wg.Wait() // registrations under way finish, their Notify answered
	f.stop()    // then the ListAndWatch streams end
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.conns {
		_ = c.Close()
	}
	return errors.Join(f.err, err)
}

// floorProcess runs a floor registrar on dir until ctx ends, in a process
// of its own (the role "floor" of ContractFloor): the floor of floorRound
// apart from the plugins, as every real registrar is. It writes "ready"
// once it watches dir and "registered <path>" once a plugin's Notify is
// answered, and returns at the first registration that fails.
func floorProcess(ctx context.Context, dir string, stdout io.Writer) error {
	var outMu sync.Mutex
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	f, err := newFloorRegistrar(dir, func(path string) {
		outMu.Lock()
		defer outMu.Unlock()
		if _, err := fmt.Fprintln(stdout, "registered", path); err != nil {
			cancel(err)
		}
	})
	if err != nil {
		return err
	}
	outMu.Lock()
	_, err = fmt.Fprintln(stdout, "ready")
	outMu.Unlock()
	if err != nil {
		return errors.Join(err, f.Close())
	}
	select {
	case <-ctx.Done():
	case <-f.failed:
	}
	err = f.Close()
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		err = errors.Join(cause, err)
	}
	return err
}

// Plugin kinds of the registration figures.
const (
	KindDevicePlugin = "device plugin"
	KindDRA          = "DRA"
)

// Kinds are the plugin kinds by the names -kinds takes; the floor phase
// measures them in the order given, by default device plugins then DRA.
var Kinds = map[string]string{"device-plugin": KindDevicePlugin, "dra": KindDRA}

// floorKinds are the kinds the floor phase measures: cfg.FloorKinds, else
// every kind.
func (c Config) floorKinds() []string {
	if len(c.FloorKinds) > 0 {
		return c.FloorKinds
	}
	return []string{KindDevicePlugin, KindDRA}
}

// FloorRound is one round of N plugins of a kind registered at once, by
// nodeplug, by the floor registrar (in the plugins' process, then in one
// of its own), by the contract floor and, with
// Config.KubeletHarness, by the kubelet's plugin manager (kubelet.go), one
// after the other.
type FloorRound struct {
	Nodeplug RoundFigures `json:"nodeplug"`
	Floor    RoundFigures `json:"floor"`
	// FloorAlone is the floor in a process of its own, apart from the
	// plugins, with its CPU.
	FloorAlone RoundFigures  `json:"floor_alone"`
	Contract   RoundFigures  `json:"contract_floor"`
	Kubelet    *RoundFigures `json:"kubelet,omitempty"`
}

// RoundFigures are one registrar's figures of a round: socket appears →
// NotifyRegistrationStatus(true) at the plugin, and first socket appeared →
// last plugin notified.
type RoundFigures struct {
	Notify  Dist    `json:"notify"`
	TotalMs float64 `json:"total_ms"`
	// CPU per plugin from the first socket to the last plugin's Notify
	// answered, summed over the registrar's processes (their CPU clocks):
	// nodeplug's services or the contract floor's three processes. Zero
	// for the floor, which shares its process with the plugins.
	CPUmsPerPlugin float64 `json:"cpu_ms_per_plugin,omitempty"`
	// CPUmsPerPluginByProcess is CPUmsPerPlugin process by process, by
	// the service's name (nodeplug) or the role's (the contract floor:
	// watcher, reconciler, devicemanager); a process that used no CPU in
	// the round is left out.
	CPUmsPerPluginByProcess map[string]float64 `json:"cpu_ms_per_plugin_by_process,omitempty"`
}

// setCPU sets f's CPU per plugin from two readings of a registrar's
// processes' CPU clocks (seconds, by process) taken around its n
// registrations: in all and process by process, in milliseconds. Only a
// process read both times counts, in both; one that used no CPU is left
// out of the breakdown. Without the second reading (a round that failed
// first) f keeps none.
func (f *RoundFigures) setCPU(before, after map[string]float64, n int) {
	if n <= 0 || after == nil {
		return
	}
	var total float64
	by := map[string]float64{}
	for p, a := range after {
		b, ok := before[p]
		if !ok {
			continue
		}
		total += a - b
		if v := round2((a - b) * 1000 / float64(n)); v > 0 {
			by[p] = v
		}
	}
	f.CPUmsPerPlugin = round2(total * 1000 / float64(n))
	f.CPUmsPerPluginByProcess = by
}

// FloorResult compares nodeplug with the floor for N plugins of a kind.
type FloorResult struct {
	Kind   string       `json:"kind"`
	N      int          `json:"n"`
	Rounds []FloorRound `json:"rounds"`
	// nodeplug / floor, the median over the rounds of each round's ratio.
	RatioP50   float64 `json:"ratio_p50"`
	RatioP99   float64 `json:"ratio_p99"`
	RatioTotal float64 `json:"ratio_total"`
	// The totals' ratios split in two (medians as above): contract floor /
	// floor is what DESIGN's split and durable registration cost at the
	// least; nodeplug / contract floor is what nodeplug adds to that.
	ContractRatioTotal float64 `json:"contract_ratio_total"`
	OverheadRatioTotal float64 `json:"overhead_ratio_total"`
	// The floor in a process of its own over the floor (medians as
	// above): what sharing the plugins' process gives the floor. And, at
	// N ≥ cpuRatioMinN, nodeplug's CPU per plugin over the floor alone's:
	// over the least CPU any registrar spends.
	AloneRatioTotal float64 `json:"alone_ratio_total"`
	CPUOverAlone    float64 `json:"cpu_over_alone,omitempty"`
	// nodeplug / the kubelet, medians as above, when the kubelet ran:
	// below 1, nodeplug is faster.
	KubeletRatioTotal float64 `json:"kubelet_ratio_total,omitempty"`
	KubeletRatioP99   float64 `json:"kubelet_ratio_p99,omitempty"`
}

// floorTargets are the targets for nodeplug / floor.
var floorTargets = map[string]float64{KindDevicePlugin: 1.5, KindDRA: 1.2}

// floor measures, for each kind and each N of cfg.RegistrationNs,
// cfg.FloorRounds rounds of nodeplug and of the other registrars of a
// FloorRound on the same kind of fleet, and the median ratios.
func (r *runner) floor(ctx context.Context) (out []FloorResult, err error) {
	rounds := max(r.cfg.FloorRounds, 1)
	// The floors and the kubelet have no one watching them register, so
	// nodeplug has none either while this phase runs: the bench's Watch
	// streams would cost the services a message per change, and the
	// bench, which hosts the plugins, the reading of it. The rounds wait
	// for deregistrations by listing; the streams resume after.
	r.unfollow()
	defer func() {
		if ferr := r.follow(ctx); ferr != nil && err == nil {
			err = fmt.Errorf("after the floor phase: %w", ferr)
		}
	}()
	warm, err := r.warmContractFloor(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = warm.Close() }()
	alone, err := r.warmFloorAlone(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = alone.Close() }()
	kubelet, err := r.warmKubelet(ctx) // nil without Config.KubeletHarness
	if err != nil {
		return nil, err
	}
	defer func() { _ = kubelet.Close() }()
	for _, kind := range r.cfg.floorKinds() {
		for _, n := range r.cfg.RegistrationNs {
			res := FloorResult{Kind: kind, N: n}
			var p50, p99, total, contract, overhead, aloneTotal, cpuAlone []float64
			for i := range rounds {
				cpu0, cpu1 := r.cpuByService(), map[string]float64(nil)
				np, err := r.round(ctx, kind, n, "", nil, func() error { cpu1 = r.cpuByService(); return nil })
				if err != nil {
					return out, fmt.Errorf("nodeplug, %d %s plugins: %w", n, kind, err)
				}
				np.setCPU(cpu0, cpu1, n)
				fl, err := r.floorRound(ctx, kind, n)
				if err != nil {
					return out, fmt.Errorf("floor, %d %s plugins: %w", n, kind, err)
				}
				fa, err := r.contractRound(ctx, alone, kind, n)
				if err != nil {
					return out, fmt.Errorf("floor alone, %d %s plugins: %w", n, kind, err)
				}
				cf, err := r.contractRound(ctx, warm, kind, n)
				if err != nil {
					return out, fmt.Errorf("contract floor, %d %s plugins: %w", n, kind, err)
				}
				kl, err := r.kubeletRound(ctx, kubelet, kind, n)
				if err != nil {
					return out, fmt.Errorf("the kubelet, %d %s plugins: %w", n, kind, err)
				}
				res.Rounds = append(res.Rounds, FloorRound{Nodeplug: np, Floor: fl, FloorAlone: fa, Contract: cf, Kubelet: kl})
				p50 = append(p50, ratio(np.Notify.P50, fl.Notify.P50))
				p99 = append(p99, ratio(np.Notify.P99, fl.Notify.P99))
				total = append(total, ratio(np.TotalMs, fl.TotalMs))
				contract = append(contract, ratio(cf.TotalMs, fl.TotalMs))
				overhead = append(overhead, ratio(np.TotalMs, cf.TotalMs))
				aloneTotal = append(aloneTotal, ratio(fa.TotalMs, fl.TotalMs))
				if n >= cpuRatioMinN {
					cpuAlone = append(cpuAlone, ratio(np.CPUmsPerPlugin, fa.CPUmsPerPlugin))
				}
				r.logf("floor: %d %s plugins, round %d: nodeplug %v total %.1f ms cpu %.2f; floor %v total %.1f ms; floor alone %v total %.1f ms cpu %.2f; contract floor %v total %.1f ms cpu %.2f", n, kind, i+1, np.Notify, np.TotalMs, np.CPUmsPerPlugin, fl.Notify, fl.TotalMs, fa.Notify, fa.TotalMs, fa.CPUmsPerPlugin, cf.Notify, cf.TotalMs, cf.CPUmsPerPlugin)
			}
			res.RatioP50, res.RatioP99, res.RatioTotal = median(p50), median(p99), median(total)
			res.ContractRatioTotal, res.OverheadRatioTotal = median(contract), median(overhead)
			res.AloneRatioTotal, res.CPUOverAlone = median(aloneTotal), median(cpuAlone)
			setKubeletRatios(&res)
			r.logf("  ratios (median of %d): p50 %.2f, p99 %.2f, total %.2f (target ≤ %.1f); total contract/floor %.2f, nodeplug/contract %.2f",
				rounds, res.RatioP50, res.RatioP99, res.RatioTotal, floorTargets[kind], res.ContractRatioTotal, res.OverheadRatioTotal)
			out = append(out, res)
		}
	}
	return out, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return round2((s[len(s)/2-1] + s[len(s)/2]) / 2)
}

// floorRound runs one round against a floor registrar watching a directory
// of its own.
func (r *runner) floorRound(ctx context.Context, kind string, n int) (RoundFigures, error) {
	dir := filepath.Join(r.root, fmt.Sprintf("floor-%d", r.seq.Add(1)))
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return RoundFigures{}, err
	}
	defer os.RemoveAll(dir)
	f, err := newFloorRegistrar(dir, nil)
	if err != nil {
		return RoundFigures{}, err
	}
	closed := false
	defer func() {
		if !closed {
			_ = f.Close()
		}
	}()
	// Once every plugin is told, the registrar stops (its last answers
	// received) before the plugins do.
	return r.round(ctx, kind, n, dir, nil, func() error { closed = true; return f.Close() })
}

// fleetPlugin is one plugin of a round: it listens in staging and appears
// in the registry by a rename.
type fleetPlugin struct {
	reg     *testplugin.Registration
	staged  string
	final   string
	stop    func()
	started time.Time
}

// round starts n plugins of kind listening in a staging directory, calls
// appear (when set) once they all listen, renames them into dir
// (plugins_registry when empty) one after the other, and measures until
// each is told it is registered. Then it calls settle (when set), removes
// them and, for nodeplug, waits until the reconciler forgot them.
func (r *runner) round(ctx context.Context, kind string, n int, dir string, appear, settle func() error) (RoundFigures, error) {
	nodeplug := dir == ""
	if nodeplug {
		dir = layout.PluginsRegistryDir(r.root)
	}
	staging := filepath.Join(r.root, fmt.Sprintf("staging-r%d", r.seq.Add(1)))
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return RoundFigures{}, err
	}
	defer os.RemoveAll(staging)
	fleet := make([]*fleetPlugin, 0, n)
	defer func() {
		for _, p := range fleet {
			p.stop()
		}
	}()
	for i := range n {
		name := fmt.Sprintf("fl%d-%d.sock", r.seq.Add(1), i)
		fp := &fleetPlugin{staged: filepath.Join(staging, name), final: filepath.Join(dir, name)}
		switch kind {
		case KindDevicePlugin:
			p, err := sampleplugin.New(sampleplugin.Options{Resource: fmt.Sprintf("floor.example.com/%s", name[:len(name)-5]), SocketPath: fp.staged, Endpoint: fp.final, Devices: 1})
			if err != nil {
				return RoundFigures{}, err
			}
			if err := p.Start(); err != nil {
				return RoundFigures{}, err
			}
			fp.reg, fp.stop = p.Registration, p.Stop
		default:
			p, err := testplugin.Start(fp.staged, testplugin.Info{Type: registerapi.DRAPlugin, Name: name[:len(name)-5] + ".floor.example.com", Endpoint: fp.final, Versions: []string{"v1.DRAPlugin"}})
			if err != nil {
				return RoundFigures{}, err
			}
			fp.reg, fp.stop = p.Registration, p.Stop
		}
		fleet = append(fleet, fp)
	}
	if appear != nil {
		if err := appear(); err != nil {
			return RoundFigures{}, err
		}
	}
	for _, fp := range fleet {
		fp.started = time.Now()
		if err := os.Rename(fp.staged, fp.final); err != nil {
			return RoundFigures{}, err
		}
	}
	var notify []time.Duration
	var last time.Time
	for _, fp := range fleet {
		t, err := registeredAt(ctx, fp.reg, fp.final+" registered")
		if err != nil {
			return RoundFigures{}, err
		}
		notify = append(notify, t.Sub(fp.started))
		if t.After(last) {
			last = t
		}
	}
	figs := RoundFigures{Notify: NewDist(notify), TotalMs: ms(last.Sub(fleet[0].started))}
	if settle != nil {
		if err := settle(); err != nil {
			return figs, err
		}
	}
	for _, fp := range fleet {
		_ = os.Remove(fp.final)
	}
	if nodeplug {
		paths := make(map[string]bool, len(fleet))
		for _, fp := range fleet {
			paths[fp.final] = true
		}
		return figs, r.awaitForgotten(ctx, paths)
	}
	return figs, nil
}

// awaitForgotten waits until the reconciler lists none of the plugins at
// paths, asking again every 20 ms, for at most a minute.
func (r *runner) awaitForgotten(ctx context.Context, paths map[string]bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		resp, err := r.rc.ListPlugins(ctx, &rcv1.ListPluginsRequest{})
		if err != nil {
			return fmt.Errorf("waiting for %d plugins to be deregistered: %w", len(paths), err)
		}
		left := 0
		for _, p := range resp.GetPlugins() {
			if paths[p.GetSocketPath()] {
				left++
			}
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d plugins still listed by the reconciler: %w", left, len(paths), ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
