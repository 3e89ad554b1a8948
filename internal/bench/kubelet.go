package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
)

// The kubelet registrar is the kubelet's own plugin registration, measured
// in the floor phase's rounds beside nodeplug when Config.KubeletHarness
// names the kubeletreg binary (test/upstream/cmd/kubeletreg; `make
// kubeletreg` builds it into bin/). kubeletreg runs the plugin manager of
// k8s.io/kubernetes v1.37.2 (pkg/kubelet/pluginmanager) with the kubelet's
// own handlers: the DRA plugin manager for DRA drivers and the device
// manager's registration server for device plugins; its package
// documentation lists what differs from a kubelet. It runs as a process of
// its own, started once for the phase and warmed like the contract floor,
// on a directory of its own; its CPU is read from /proc.
//
// The device manager keeps its checkpoint under /var/lib/kubelet, which no
// exported API moves: kubeletreg bind-mounts a directory of the bench's root
// over it, in a mount namespace it is started in (CLONE_NEWNS). That needs
// root.
//
// Its stdout says when it is ready ("ready"), when the device manager
// handled a device plugin's first ListAndWatch answer ("devices"), and when
// a plugin was deregistered ("deregistered"). A round of device plugins
// waits for their "devices" lines before it reads the CPU used, as
// nodeplug's registration of a device plugin includes that answer (the
// kubelet tells the plugin it is registered before the answer, nodeplug
// after). Every round waits for its "deregistered" lines before the next
// registrar's round, as the kubelet deregisters in its next reconciler
// pass, up to a second after the sockets went.
//
// The kubelet registers a socket in the first reconciler pass after it
// appeared, and passes once a second: a plugin waits up to a second, half
// of one on average. A round that started as soon as the previous one's
// deregistrations were seen would always start just after a pass, and
// wait the longest. So the plugins of each round appear half a period
// after the pass that deregistered the previous round's (the first
// "deregistered" line of that round): the mean wait of a plugin appearing
// at a random moment.

// kubeletPeriod is the kubelet plugin manager's reconciler period
// (pkg/kubelet/pluginmanager, loopSleepDuration).
const kubeletPeriod = time.Second

// kubeletRegistrar is a running kubeletreg and its directories.
type kubeletRegistrar struct {
	cmd       *exec.Cmd
	dir, root string
	stderr    *stack.Tail
	ended     chan struct{} // closed once the process ended
	lines     lineCounts
	want      map[string]int // lines of each kind awaited so far
	pass      time.Time      // when the last round's deregistrations started

	mu      sync.Mutex
	closing bool
	err     error
}

// warmKubelet starts kubeletreg on a directory of its own and registers
// one plugin of each kind through it, unmeasured. It returns nil when
// Config.KubeletHarness is empty. Close it when done.
func (r *runner) warmKubelet(ctx context.Context) (*kubeletRegistrar, error) {
	if r.cfg.KubeletHarness == "" {
		return nil, nil
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("the kubelet registrar (-kubelet-harness) needs root: it runs in a mount namespace of its own, with a directory of the bench's mounted over /var/lib/kubelet")
	}
	seq := r.seq.Add(1)
	k := &kubeletRegistrar{
		dir:    filepath.Join(r.root, fmt.Sprintf("kubelet-%d", seq)),
		root:   filepath.Join(r.root, fmt.Sprintf("kl%d", seq)), // its /var/lib/kubelet
		stderr: &stack.Tail{Max: 8 << 10},
		ended:  make(chan struct{}),
		lines:  lineCounts{at: map[string][]time.Time{}, changed: make(chan struct{})},
		want:   map[string]int{},
	}
	if err := k.start(ctx, r.cfg.KubeletHarness); err != nil {
		_ = k.Close()
		return nil, fmt.Errorf("the kubelet registrar: %w", err)
	}
	for _, kind := range r.cfg.floorKinds() {
		if _, err := r.kubeletOnce(ctx, k, kind, 1); err != nil {
			_ = k.Close()
			return nil, fmt.Errorf("the kubelet registrar's warm-up: %w", err)
		}
	}
	return k, nil
}

// start starts the process and returns once it is ready.
func (k *kubeletRegistrar) start(ctx context.Context, harness string) error {
	if err := os.MkdirAll(k.dir, 0o750); err != nil {
		return err
	}
	k.cmd = exec.Command(harness, "-dir", k.dir, "-kubelet-root", k.root)
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	k.cmd.Stderr = k.stderr
	out, err := k.cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := k.cmd.Start(); err != nil {
		return err
	}
	go k.read(out)
	return k.await(ctx, "ready", 1)
}

// read counts the process's lines by their first word until it ends, then
// records why it ended unless Close stopped it.
func (k *kubeletRegistrar) read(out io.Reader) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		word, _, _ := strings.Cut(sc.Text(), " ")
		k.lines.add(word)
	}
	err := k.cmd.Wait()
	k.mu.Lock()
	if !k.closing && k.err == nil {
		k.err = fmt.Errorf("kubeletreg ended: %v: %s", err, strings.TrimSpace(k.stderr.String()))
	}
	k.mu.Unlock()
	close(k.ended)
}

// await returns once the process has written n more lines starting with
// word than were awaited before.
func (k *kubeletRegistrar) await(ctx context.Context, word string, n int) error {
	k.want[word] += n
	return k.lines.await(ctx, k.ended, k.failure, word, k.want[word])
}

func (k *kubeletRegistrar) failure() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

func (k *kubeletRegistrar) cpuSeconds() float64 {
	v, _ := cpuSeconds(k.cmd.Process.Pid)
	return v
}

// Close stops the process (SIGTERM, then SIGKILL after 30 s), removes the
// directories and returns why the process ended early, if it did. A nil
// registrar is closed already.
func (k *kubeletRegistrar) Close() error {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	k.closing = true
	k.mu.Unlock()
	if k.cmd != nil && k.cmd.Process != nil {
		_ = k.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-k.ended:
		case <-time.After(30 * time.Second):
			_ = k.cmd.Process.Kill()
			<-k.ended
		}
	}
	_ = os.RemoveAll(k.dir)
	_ = os.RemoveAll(k.root)
	return k.failure()
}

// kubeletRound runs one measured round against k, nil when there is no
// kubelet registrar, and logs its figures.
func (r *runner) kubeletRound(ctx context.Context, k *kubeletRegistrar, kind string, n int) (*RoundFigures, error) {
	if k == nil {
		return nil, nil
	}
	figs, err := r.kubeletOnce(ctx, k, kind, n)
	if err != nil {
		return nil, err
	}
	r.logf("floor: %d %s plugins: the kubelet %v total %.1f ms", n, kind, figs.Notify, figs.TotalMs)
	return &figs, nil
}

// kubeletOnce runs one round against k, and waits until the kubelet has
// deregistered its plugins. It fails as soon as the process ends.
func (r *runner) kubeletOnce(ctx context.Context, k *kubeletRegistrar, kind string, n int) (RoundFigures, error) {
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case <-k.ended:
			cancel(k.failure())
		case <-rctx.Done():
		}
	}()
	var cpu0, cpu1 float64
	// The plugins appear half a period after the last pass once they all
	// listen: starting a thousand of them takes a good part of a period,
	// which would otherwise move the moment they appear.
	appear := func() error {
		err := k.halfPeriodAfterPass(rctx)
		cpu0 = k.cpuSeconds()
		return err
	}
	figs, err := r.round(rctx, kind, n, k.dir, appear, func() error {
		var err error
		if kind == KindDevicePlugin {
			err = k.await(rctx, "devices", n)
		}
		cpu1 = k.cpuSeconds()
		return err
	})
	figs.CPUmsPerPlugin = round2((cpu1 - cpu0) * 1000 / float64(n))
	if err == nil {
		err = k.await(rctx, "deregistered", n)
		k.pass = k.lines.time("deregistered", k.want["deregistered"]-n)
	}
	if cause := context.Cause(rctx); err != nil && cause != nil && !errors.Is(cause, context.Canceled) {
		err = cause
	}
	return figs, err
}

// halfPeriodAfterPass waits until half a reconciler period after the
// kubelet's pass that deregistered the last round's plugins (at once before
// the first round): see kubeletPeriod.
func (k *kubeletRegistrar) halfPeriodAfterPass(ctx context.Context) error {
	if k.pass.IsZero() {
		return nil
	}
	since := time.Since(k.pass) % kubeletPeriod
	wait := (kubeletPeriod/2 - since + kubeletPeriod) % kubeletPeriod
	select {
	case <-time.After(wait):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lineCounts counts lines by their first word, with the time each came,
// and lets callers wait for a count.
type lineCounts struct {
	mu      sync.Mutex
	at      map[string][]time.Time
	changed chan struct{} // closed and replaced at each line
}

func (c *lineCounts) add(word string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at[word] = append(c.at[word], time.Now())
	close(c.changed)
	c.changed = make(chan struct{})
}

// time is when the line starting with word numbered i (from 0) came.
func (c *lineCounts) time(word string, i int) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i < 0 || i >= len(c.at[word]) {
		return time.Time{}
	}
	return c.at[word][i]
}

// await returns once want lines starting with word were counted. It fails
// when ended is closed first (with failure's error) or ctx ends, and after
// two minutes.
func (c *lineCounts) await(ctx context.Context, ended <-chan struct{}, failure func() error, word string, want int) error {
	timeout := time.After(2 * time.Minute)
	for {
		c.mu.Lock()
		got, changed := len(c.at[word]), c.changed
		c.mu.Unlock()
		if got >= want {
			return nil
		}
		select {
		case <-changed:
		case <-ended:
			if err := failure(); err != nil {
				return err
			}
			return fmt.Errorf("kubeletreg ended with %d of %d %q lines", got, want, word)
		case <-ctx.Done():
			return ctx.Err()
		case <-timeout:
			return fmt.Errorf("kubeletreg wrote %d of %d %q lines in two minutes", got, want, word)
		}
	}
}

// setKubeletRatios sets res's kubelet ratios, nodeplug over the kubelet,
// the medians over the rounds that ran the kubelet.
func setKubeletRatios(res *FloorResult) {
	var total, p99 []float64
	for _, rd := range res.Rounds {
		if rd.Kubelet != nil {
			total = append(total, ratio(rd.Nodeplug.TotalMs, rd.Kubelet.TotalMs))
			p99 = append(p99, ratio(rd.Nodeplug.Notify.P99, rd.Kubelet.Notify.P99))
		}
	}
	res.KubeletRatioTotal, res.KubeletRatioP99 = median(total), median(p99)
}

// PrintKubelet writes the kubelet's section: for each kind and N it ran,
// its figures and nodeplug's in the same rounds (each the median over the
// rounds) and nodeplug over the kubelet. It writes nothing when the
// kubelet did not run.
func PrintKubelet(w io.Writer, r *Results) {
	header := false
	for _, f := range r.Floor {
		var kl, np []RoundFigures
		for _, rd := range f.Rounds {
			if rd.Kubelet != nil {
				kl, np = append(kl, *rd.Kubelet), append(np, rd.Nodeplug)
			}
		}
		if len(kl) == 0 {
			continue
		}
		if !header {
			printKubeletHeader(w)
			header = true
		}
		k, n := medianFigures(kl), medianFigures(np)
		cpu := ""
		if f.N >= cpuRatioMinN {
			cpu = fmt.Sprintf(" | CPU per plugin: kubelet %.2f ms, nodeplug %.2f ms", k.CPUmsPerPlugin, n.CPUmsPerPlugin)
		}
		fmt.Fprintf(w, "  %-13s N=%-5d kubelet p50 %7.1f  p99 %7.1f  total %7.1f ms | nodeplug p50 %7.1f  p99 %7.1f  total %7.1f ms | nodeplug/kubelet p99 %.2f×  total %.2f×%s\n",
			f.Kind, f.N, k.Notify.P50, k.Notify.P99, k.TotalMs, n.Notify.P50, n.Notify.P99, n.TotalMs, f.KubeletRatioP99, f.KubeletRatioTotal, cpu)
	}
}

func printKubeletHeader(w io.Writer) {
	fmt.Fprintln(w, "\nRegistration against the kubelet's plugin manager (k8s.io/kubernetes v1.37.2, in its own process)")
	fmt.Fprintln(w, "(kubeletreg: pkg/kubelet/pluginmanager with the kubelet's handlers, the device manager's for device plugins, the DRA")
	fmt.Fprintln(w, "plugin manager with a fake API client for DRA drivers); the floor phase's rounds and plugins, socket appears →")
	fmt.Fprintln(w, "NotifyRegistrationStatus(true) at the plugin. Its reconciler passes once a second: the plugins appear half a second after")
	fmt.Fprintln(w, "a pass, the mean wait of a random moment. Each figure the median of the rounds; nodeplug/kubelet below 1: nodeplug is faster")
}

// median is the median of each figure of one registrar's rounds, which
// of (the nodeplug, floor or contract floor figures of a round).
func (f FloorResult) median(which func(FloorRound) RoundFigures) RoundFigures {
	rounds := make([]RoundFigures, 0, len(f.Rounds))
	for _, rd := range f.Rounds {
		rounds = append(rounds, which(rd))
	}
	return medianFigures(rounds)
}

// medianFigures is the median of each figure of rounds. A process's CPU
// is the median over every round, zero in a round that left it out.
func medianFigures(rounds []RoundFigures) RoundFigures {
	var p50, p99, total, cpu []float64
	processes := map[string]bool{}
	for _, f := range rounds {
		p50, p99 = append(p50, f.Notify.P50), append(p99, f.Notify.P99)
		total, cpu = append(total, f.TotalMs), append(cpu, f.CPUmsPerPlugin)
		for p := range f.CPUmsPerPluginByProcess {
			processes[p] = true
		}
	}
	out := RoundFigures{Notify: Dist{P50: median(p50), P99: median(p99)}, TotalMs: median(total), CPUmsPerPlugin: median(cpu)}
	for p := range processes {
		v := make([]float64, 0, len(rounds))
		for _, f := range rounds {
			v = append(v, f.CPUmsPerPluginByProcess[p])
		}
		if m := median(v); m > 0 {
			if out.CPUmsPerPluginByProcess == nil {
				out.CPUmsPerPluginByProcess = map[string]float64{}
			}
			out.CPUmsPerPluginByProcess[p] = m
		}
	}
	return out
}
