package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/pkg/lockfile"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/pkg/version"
)

// DefaultRootDir is the kubelet's root directory.
const DefaultRootDir = "/var/lib/kubelet"

// Config holds what every service binary is configured with.
type Config struct {
	Binary        string // "watcher", "reconciler", "devicemanager"
	RootDir       string
	Listen        string
	MetricsListen string
	AllowedDirs   []string // --allowed-endpoint-dir; defaults to RootDir
	Pprof         bool     // serve /debug/pprof/ beside /metrics
	LogLevel      string
	LogFormat     string
}

// PluginsDir is <root>/plugins_registry.
func (c *Config) PluginsDir() string { return filepath.Join(c.RootDir, "plugins_registry") }

// DevicePluginsDir is <root>/device-plugins.
func (c *Config) DevicePluginsDir() string { return filepath.Join(c.RootDir, "device-plugins") }

// Service describes one binary: its name, default addresses, extra flags and
// what it runs.
type Service struct {
	Binary         string
	DefaultListen  string
	DefaultMetrics string
	// Flags lets the service define its own flags on fs.
	Flags func(fs *Flags)
	// Setup registers gRPC services on rt.Server and starts background work
	// with rt.Go. It runs after the lock is taken and the listeners are bound,
	// before serving starts.
	Setup func(ctx context.Context, rt *Runtime) error
}

// Runtime is what Setup gets.
type Runtime struct {
	Config  Config
	Log     *slog.Logger
	Metrics *prometheus.Registry
	Server  *grpc.Server
	Health  *health.Server
	// Addr is the bound gRPC address (useful with port 0).
	Addr net.Addr

	group    *errgroup.Group
	ctx      context.Context
	deferred bool
}

// stopTimeout bounds a graceful stop: open streams never end on their own.
const stopTimeout = 5 * time.Second

// DeferReady keeps the gRPC health NOT_SERVING after Setup returns, until
// the returned function is called (once the service can do its job).
func (rt *Runtime) DeferReady() (ready func()) {
	rt.deferred = true
	return func() {
		// After shutdown began, the health server ignores this.
		rt.Health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
		rt.Log.Info("ready")
	}
}

// ServeUnix serves a second gRPC server on a new Unix socket at path (mode
// 0600, its directory created 0750), built as the API server is (logging,
// recovery, error mapping, tracing, health, reflection). register adds the
// services to it. It serves until the service stops, then stops gracefully
// and removes the socket. It is how kubelet.sock (and any further socket) is
// served.
func (rt *Runtime) ServeUnix(path string, register func(*grpc.Server)) error {
	lis, err := unixsock.Listen(path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	s, _ := rpcutil.NewServer(rt.Log)
	register(s)
	rt.Log.Info("gRPC listening", "socket", path)
	rt.serve(lis, s, func() {})
	return nil
}

// serve serves s on lis in the background; once the service stops it runs
// before, stops s gracefully and removes a Unix socket it created.
func (rt *Runtime) serve(lis net.Listener, s *grpc.Server, before func()) {
	rt.group.Go(func() error {
		if err := s.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("gRPC server on %s: %w", lis.Addr(), err)
		}
		return nil
	})
	rt.group.Go(func() error {
		<-rt.ctx.Done()
		before()
		// Stopping closes lis, which removes a Unix socket (unixsock).
		rpcutil.StopGracefully(s, stopTimeout)
		return nil
	})
}

// Go runs f in the background until the service stops. An error from f stops
// the service.
func (rt *Runtime) Go(f func(ctx context.Context) error) {
	rt.group.Go(func() error { return f(rt.ctx) })
}

// Main parses args, runs the service until SIGINT or SIGTERM, and returns the
// process exit code. "healthcheck" as the first argument instead checks the
// gRPC health of a running instance at --listen (for container
// healthchecks, where there is no shell).
func Main(svc Service, args []string) int {
	if len(args) > 0 && args[0] == "healthcheck" {
		return healthcheck(svc, args[1:])
	}
	cfg, code, ok := parse(svc, args)
	if !ok {
		return code
	}
	log, err := telemetry.NewLogger(os.Stderr, cfg.LogFormat, cfg.LogLevel)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-"+svc.Binary+":", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, svc, cfg, log); err != nil {
		log.Error("exiting", "error", err)
		return 1
	}
	return 0
}

func commonFlags(svc Service, fs *Flags, cfg *Config) *bool {
	fs.StringVar(&cfg.RootDir, "root-dir", DefaultRootDir, "root directory: plugins_registry/ and device-plugins/ are beneath it")
	fs.StringVar(&cfg.Listen, "listen", svc.DefaultListen, "gRPC listen address (host:port; port 0 picks a free port)")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", svc.DefaultMetrics, "Prometheus /metrics listen address (empty disables it)")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", "text", "log format: text or json")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the metrics address")
	return fs.Bool("version", false, "print the version and exit")
}

func parse(svc Service, args []string) (Config, int, bool) {
	cfg := Config{Binary: svc.Binary}
	fs := NewFlags(svc.Binary)
	showVersion := commonFlags(svc, fs, &cfg)
	allowed := fs.StringList("allowed-endpoint-dir", "directory plugin endpoints may live in (repeatable; default the root dir)")
	if svc.Flags != nil {
		svc.Flags(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, 0, false
		}
		fmt.Fprintln(os.Stderr, "nodeplug-"+svc.Binary+":", err)
		return cfg, 2, false
	}
	if *showVersion {
		fmt.Printf("nodeplug-%s %s\n", svc.Binary, version.Version)
		return cfg, 0, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "nodeplug-%s: unexpected arguments %v\n", svc.Binary, fs.Args())
		return cfg, 2, false
	}
	abs, err := filepath.Abs(cfg.RootDir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-"+svc.Binary+":", err)
		return cfg, 2, false
	}
	cfg.RootDir = abs
	cfg.AllowedDirs = *allowed
	if len(cfg.AllowedDirs) == 0 {
		cfg.AllowedDirs = []string{cfg.RootDir}
	}
	return cfg, 0, true
}

func healthcheck(svc Service, args []string) int {
	cfg := Config{Binary: svc.Binary}
	fs := NewFlags(svc.Binary)
	fs.StringVar(&cfg.Listen, "listen", svc.DefaultListen, "gRPC address of the instance to check")
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	addr := cfg.Listen
	if host, port, err := net.SplitHostPort(addr); err == nil && (host == "" || host == "0.0.0.0" || host == "::") {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	conn, err := rpcutil.DialPeer(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "nodeplug-%s at %s: %v\n", svc.Binary, addr, err)
		return 1
	}
	fmt.Printf("nodeplug-%s at %s: %s\n", svc.Binary, addr, resp.GetStatus())
	if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		return 1
	}
	return 0
}

// Run runs svc with cfg until ctx ends or a background task fails.
func Run(ctx context.Context, svc Service, cfg Config, log *slog.Logger) (err error) {
	name := "nodeplug-" + svc.Binary
	shutdownTracing, err := telemetry.Setup(ctx, name, version.Version)
	if err != nil {
		return fmt.Errorf("tracing setup: %w", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if e := shutdownTracing(sctx); e != nil {
			log.Warn("flushing traces", "error", e)
		}
	}()

	if err := os.MkdirAll(cfg.RootDir, 0o750); err != nil {
		return fmt.Errorf("create root dir: %w", err)
	}
	lock, err := lockfile.Acquire(filepath.Join(cfg.RootDir, name+".lock"))
	if err != nil {
		return fmt.Errorf("another %s runs with root dir %s: %w", name, cfg.RootDir, err)
	}
	defer lock.Release()

	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("gRPC listen on %s: %w", cfg.Listen, err)
	}
	defer lis.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The metrics listener is bound before Setup, so that a failure here
	// leaves nothing behind (Setup may create sockets).
	var mlis net.Listener
	if cfg.MetricsListen != "" {
		if mlis, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return fmt.Errorf("metrics listen on %s: %w", cfg.MetricsListen, err)
		}
		defer mlis.Close()
	}

	server, healthSrv := rpcutil.NewServer(log)
	healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(sctx)
	rt := &Runtime{Config: cfg, Log: log, Metrics: reg, Server: server, Health: healthSrv, Addr: lis.Addr(), group: g, ctx: gctx}
	if err := svc.Setup(gctx, rt); err != nil {
		// Stop what Setup started (its background work, the sockets it
		// serves, which are removed) before reporting the failure.
		cancel()
		_ = g.Wait()
		return err
	}
	if !rt.deferred {
		healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	}

	if mlis != nil {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		if cfg.Pprof {
			mux.HandleFunc("/debug/pprof/", pprof.Index)
			mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
			mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		}
		metricsSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		log.Info("metrics listening", "addr", mlis.Addr().String(), "url", "http://"+mlis.Addr().String()+"/metrics")
		g.Go(func() error {
			if err := metricsSrv.Serve(mlis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics server: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-gctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = metricsSrv.Shutdown(sctx)
			return nil
		})
	}
	log.Info("gRPC listening", "service", name, "addr", lis.Addr().String(), "root_dir", cfg.RootDir, "version", version.Version)
	rt.serve(lis, server, func() {
		log.Info("shutting down")
		healthSrv.Shutdown()
	})
	err = g.Wait()
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
