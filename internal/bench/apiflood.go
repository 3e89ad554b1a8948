package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// APIFloodConfig is the resource API flood (nodeplug-bench -scenario
// apiflood): a nodeplug-apiserver process of its own, flooded as a driver
// could flood it, while another client lists and watches throughout.
type APIFloodConfig struct {
	Bin  string // directory with nodeplug-apiserver
	Root string // root dir; a temporary one when empty
	// Watches are opened as the driver and never read (each on an HTTP/1.1
	// connection of its own, so the client's kernel stops taking data).
	Watches int
	// Churn slices of ChurnDevices devices are created and deleted, one
	// after the other, while Updates replace a maximal slice (as large as
	// the API stores) one after the other.
	Churn, ChurnDevices, Updates int
	// After is how long after the clients close the end figures are taken.
	After    time.Duration
	Progress io.Writer
}

// DefaultAPIFlood is the flood of issue D1: 500 watches that never read,
// 300 create/delete of 128-device slices, 150 updates of a maximal object;
// the end figures a minute after the clients close.
func DefaultAPIFlood() APIFloodConfig {
	return APIFloodConfig{Watches: 500, Churn: 300, ChurnDevices: 128, Updates: 150, After: time.Minute}
}

// ShortAPIFlood is a quick run of the same.
func ShortAPIFlood() APIFloodConfig {
	return APIFloodConfig{Watches: 50, Churn: 30, ChurnDevices: 128, Updates: 15, After: 10 * time.Second}
}

// APIFloodResult is what the flood cost the API server and its other
// client.
type APIFloodResult struct {
	Config APIFloodConfig `json:"-"`
	// The API server's resident set: at the start (idle, before any
	// client), its peak (VmHWM), and After the clients closed.
	StartRSSMiB, PeakRSSMiB, EndRSSMiB float64
	// Its heap in use (go_memstats_heap_inuse_bytes): at the start, the
	// highest seen (sampled), and After the clients closed.
	StartHeapMiB, PeakHeapMiB, EndHeapMiB float64
	FloodSeconds                          float64
	MaximalBytes                          int  // the maximal slice, as the client encodes it
	TooLargeRefused                       bool // a slice over the limit was refused with 413
	WatchesOpen                           int  // the silent watches the server counted open
	// From the server's metrics after the flood.
	Refused, CutOff map[string]float64
	Observer        ObserverResult
}

// APIFlood runs the flood and returns its figures.
func APIFlood(ctx context.Context, cfg APIFloodConfig) (*APIFloodResult, error) {
	root, cleanup, err := floodRoot(cfg.Root)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	srv, err := startFloodServer(ctx, cfg, root)
	if err != nil {
		return nil, err
	}
	defer func() { _ = srv.proc.Stop(10 * time.Second) }()
	res := &APIFloodResult{Config: cfg}
	if err := srv.waitIdle(ctx); err != nil {
		return nil, err
	}
	if m, err := readRSS(srv.pid()); err == nil {
		res.StartRSSMiB = m.VmRSS
	}
	res.StartHeapMiB = srv.heapMiB(ctx)
	logf(cfg.Progress, "apiflood: nodeplug-apiserver at %s, RSS %.1f MiB, heap %.1f MiB", srv.api, res.StartRSSMiB, res.StartHeapMiB)
	mem := followMemory(ctx, srv)
	if err := flood(ctx, cfg, srv, res); err != nil {
		return nil, err
	}
	logf(cfg.Progress, "apiflood: clients closed; waiting %v", cfg.After)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(cfg.After):
	}
	if m, err := readRSS(srv.pid()); err == nil {
		res.EndRSSMiB, res.PeakRSSMiB = m.VmRSS, m.Peak
	}
	res.EndHeapMiB = srv.heapMiB(ctx)
	res.PeakHeapMiB = max(mem.stop(), res.StartHeapMiB, res.EndHeapMiB)
	return res, nil
}

// flood opens the silent watches and the observer, runs the writers, and
// closes every client.
func flood(ctx context.Context, cfg APIFloodConfig, srv *floodServer, res *APIFloodResult) error {
	obsCtx, stopObs := context.WithCancel(ctx)
	obs := startObserver(obsCtx, srv.reader)
	defer stopObs()
	silent, err := openSilentWatches(srv.driverCfg, cfg.Watches)
	if err != nil {
		return err
	}
	defer silent.close()
	if res.WatchesOpen, err = srv.waitWatches(ctx, cfg.Watches+1); err != nil {
		return err
	}
	logf(cfg.Progress, "apiflood: %d watches open (%d silent, the observer's); flooding", res.WatchesOpen, cfg.Watches)
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return churn(gctx, srv.driver, cfg.Churn, cfg.ChurnDevices) })
	g.Go(func() (err error) {
		res.MaximalBytes, res.TooLargeRefused, err = updateMaximal(gctx, srv.driver, cfg.Updates)
		return err
	})
	if err := g.Wait(); err != nil {
		return err
	}
	res.FloodSeconds = time.Since(start).Seconds()
	res.Refused, res.CutOff = srv.boundCounts(ctx)
	silent.close()
	stopObs()
	res.Observer = obs.wait()
	return nil
}

func floodRoot(root string) (string, func(), error) {
	if root != "" {
		return root, func() {}, nil
	}
	dir, err := os.MkdirTemp("", "npflood")
	if err != nil {
		return "", nil, err
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}

// floodServer is the nodeplug-apiserver process and its clients.
type floodServer struct {
	proc      *stack.Process
	api       string // the resource API's address
	metrics   string // its /metrics URL
	driverCfg *rest.Config
	driver    kubernetes.Interface // the drivers' identity
	reader    kubernetes.Interface // the reader's identity
}

func (s *floodServer) pid() int { return s.proc.Cmd.Process.Pid }

// startFloodServer starts nodeplug-apiserver with room for every silent
// watch (the worst case: the defaults would refuse those beyond 250 of
// one caller), and makes the clients from the kubeconfigs it writes.
func startFloodServer(ctx context.Context, cfg APIFloodConfig, root string) (*floodServer, error) {
	args := []string{"--root-dir", root, "--metrics-listen", "127.0.0.1:0", "--log-level", "info", "--node-name", floodNode,
		"--resource-api-max-watches", fmt.Sprint(cfg.Watches + 100), "--resource-api-max-watches-per-caller", fmt.Sprint(cfg.Watches + 50)}
	p, err := stack.Start(filepath.Join(cfg.Bin, "nodeplug-apiserver"), args, nil)
	if err != nil {
		return nil, err
	}
	s := &floodServer{proc: p}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if s.api, err = p.Addr(wctx, "serving the node-local resource API"); err == nil {
		s.metrics, err = p.Addr(wctx, "metrics listening")
	}
	if err == nil {
		s.metrics = "http://" + s.metrics + "/metrics"
		s.driverCfg, s.driver, err = clientOf(layout.KubeconfigFile(root))
	}
	if err == nil {
		_, s.reader, err = clientOf(layout.IdentityKubeconfigFile(root, "reader"))
	}
	if err != nil {
		p.Kill()
		return nil, err
	}
	return s, nil
}

func clientOf(kubeconfig string) (*rest.Config, kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, nil, err
	}
	cfg.QPS, cfg.Timeout = -1, time.Minute
	c, err := kubernetes.NewForConfig(cfg)
	return cfg, c, err
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// PrintAPIFlood writes the figures.
func PrintAPIFlood(w io.Writer, r *APIFloodResult) {
	c := r.Config
	fmt.Fprintf(w, "Resource API flood: nodeplug-apiserver, %d watches that never read, %d create/delete of %d-device slices\n", c.Watches, c.Churn, c.ChurnDevices)
	fmt.Fprintf(w, "and %d updates of a maximal slice (%d bytes), at once, in %.1f s; another client lists and watches throughout\n", c.Updates, r.MaximalBytes, r.FloodSeconds)
	fmt.Fprintf(w, "  RSS   start %6.1f MiB  peak (VmHWM) %6.1f MiB  %v after the clients closed %6.1f MiB (%+.1f MiB)   target: peak < 256, end within 20 of start\n",
		r.StartRSSMiB, r.PeakRSSMiB, c.After, r.EndRSSMiB, r.EndRSSMiB-r.StartRSSMiB)
	fmt.Fprintf(w, "  heap  start %6.1f MiB  peak (sampled) %6.1f MiB  end %6.1f MiB  (go_memstats_heap_inuse_bytes)\n", r.StartHeapMiB, r.PeakHeapMiB, r.EndHeapMiB)
	fmt.Fprintf(w, "  watches open during the flood %d; refused per caller %.0f, total %.0f; cut off for their buffer's events %.0f, bytes %.0f, the history %.0f\n",
		r.WatchesOpen, r.Refused["per_caller"], r.Refused["total"], r.CutOff["buffer_events"], r.CutOff["buffer_bytes"], r.CutOff["history"])
	fmt.Fprintf(w, "  a slice over 1.5 MiB refused with 413: %v\n", r.TooLargeRefused)
	o := r.Observer
	fmt.Fprintf(w, "  other client: %d lists, %d failed, slowest %.0f ms; its watch: %d events, %d failures, %d ended by the server (re-watched), %d re-lists after 410\n",
		o.Lists, o.ListFailures, o.SlowestListMs, o.Events, o.WatchFailures, o.WatchEnds, o.Relists)
}
