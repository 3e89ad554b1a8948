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
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/pkg/access"
	"github.com/nodeplug/nodeplug/pkg/lockfile"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/pkg/version"
)

// DefaultRootDir is the kubelet's root directory.
const DefaultRootDir = "/var/lib/kubelet"

// Config holds what every service binary is configured with.
type Config struct {
	Binary  string // "watcher", "reconciler", "devicemanager"
	RootDir string
	// APISocket is the API's Unix socket (--api-socket), default
	// <root>/nodeplug/<binary>.sock.
	APISocket string
	// APIGroup is the group of the API socket and its directory
	// (--api-group, a name or GID; empty: the process's own group).
	APIGroup string
	// OperatorGroup's members may Allocate and Release (--operator-group).
	OperatorGroup string
	// ListenTCP is an optional TCP address for the API (--listen-tcp); it
	// requires mutual TLS unless TLS.Insecure.
	ListenTCP     string
	TLS           TLS
	MetricsListen string
	AllowedDirs   []string // --allowed-endpoint-dir; defaults to RootDir
	Pprof         bool     // serve /debug/pprof/ beside /metrics
	LogLevel      string
	LogFormat     string

	// Watch bounds the streams of every Watch RPC by caller
	// (--watch-streams, --watch-streams-per-caller,
	// --watch-streams-reserved); see access.WatchBounds.
	Watch stream.SlotLimits
}

// PluginsDir is <root>/plugins_registry.
func (c *Config) PluginsDir() string { return PluginsRegistryDir(c.RootDir) }

// DevicePluginsDir is <root>/device-plugins.
func (c *Config) DevicePluginsDir() string { return DevicePluginsDir(c.RootDir) }

// Service describes one binary: its name, default addresses, extra flags and
// what it runs.
type Service struct {
	Binary         string
	DefaultMetrics string
	// Flags lets the service define its own flags on fs.
	Flags func(fs *Flags)
	// Setup registers gRPC services on rt.Server and starts background work
	// with rt.Go. It runs after the lock is taken and the listeners are bound,
	// before serving starts.
	Setup func(ctx context.Context, rt *Runtime) error
	// GCPercent is the garbage collector's target (GOGC) the service runs
	// with when the GOGC environment variable is not set; 0 leaves Go's
	// default, 100. GOGC, when set, always wins.
	GCPercent int
	// Settle, when set, gives the memory of a burst of work back to the OS
	// once the burst is over (see Settle).
	Settle *Settle
	// HandlerPool, when larger than rpcutil's default (4 per CPU), is the
	// API server's pool of handler goroutines, kept between calls. A call
	// that finds every worker busy runs on a fresh goroutine, whose stack
	// grows again through the whole handler path; a service that takes many
	// calls at once sizes the pool to them.
	HandlerPool int
}

// Runtime is what Setup gets.
type Runtime struct {
	Config  Config
	Log     *slog.Logger
	Metrics *prometheus.Registry
	Server  *grpc.Server
	Health  *health.Server
	// Addr is the API socket's address.
	Addr net.Addr
	// TCPAddr is the bound --listen-tcp address (nil without it).
	TCPAddr net.Addr

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
// 0600, owned by the process's user, its directory created 0750), built as
// the API server is (logging, recovery, error mapping, tracing, health,
// reflection) with opts added. register adds the services to it. It serves
// until the service stops, then stops gracefully and removes the socket. It
// is how kubelet.sock, the pod resources socket (and any further socket)
// are served.
func (rt *Runtime) ServeUnix(path string, register func(*grpc.Server), opts ...grpc.ServerOption) error {
	lis, err := unixsock.Listen(path)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", path, err)
	}
	s, _ := rpcutil.NewServer(rt.Log, opts...)
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
// gRPC health of a running instance on its API socket (for container
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
	if p, ok := gcPercent(svc, os.Getenv); ok {
		debug.SetGCPercent(p)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := Run(ctx, svc, cfg, log); err != nil {
		log.Error("exiting", "error", err)
		return 1
	}
	return 0
}

// gcPercent returns the GOGC that svc.GCPercent asks for, unless the
// environment sets GOGC itself or the service keeps Go's default.
func gcPercent(svc Service, getenv func(string) string) (int, bool) {
	if svc.GCPercent == 0 || getenv("GOGC") != "" {
		return 0, false
	}
	return svc.GCPercent, true
}

func commonFlags(svc Service, fs *Flags, cfg *Config) *bool {
	fs.StringVar(&cfg.RootDir, "root-dir", DefaultRootDir, "root directory: plugins_registry/, device-plugins/ and nodeplug/ (the API sockets) are beneath it")
	fs.StringVar(&cfg.APISocket, "api-socket", "", "the API's Unix socket (default <root-dir>/nodeplug/"+svc.Binary+".sock)")
	fs.StringVar(&cfg.APIGroup, "api-group", "", "group (name or GID) of the API socket and its directory; members may read (default: the process's group)")
	fs.StringVar(&cfg.OperatorGroup, "operator-group", "", "group (name or GID) whose members may Allocate and Release")
	fs.StringVar(&cfg.ListenTCP, "listen-tcp", "", "also serve the API on this TCP host:port, with mutual TLS (off by default)")
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert-file", "", "certificate for --listen-tcp, also the client certificate for TCP peers")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key-file", "", "key of --tls-cert-file")
	fs.StringVar(&cfg.TLS.ClientCAFile, "tls-client-ca-file", "", "CA certificate that signs the clients allowed on --listen-tcp")
	fs.StringVar(&cfg.TLS.CAFile, "tls-ca-file", "", "CA certificate that signs TCP peers' certificates")
	fs.BoolVar(&cfg.TLS.Insecure, "insecure-tcp", false, "serve and dial TCP without TLS: tests only, loopback only")
	fs.Var(goneFlag{errListenGone}, "listen", "removed: see --api-socket and --listen-tcp")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", svc.DefaultMetrics, "Prometheus /metrics listen address (empty disables it)")
	fs.StringVar(&cfg.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&cfg.LogFormat, "log-format", "text", "log format: text or json")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve Go profiles at /debug/pprof/ on the metrics address (loopback only)")
	return fs.Bool("version", false, "print the version and exit")
}

func parse(svc Service, args []string) (Config, int, bool) {
	cfg := Config{Binary: svc.Binary}
	fs := NewFlags(svc.Binary)
	showVersion := commonFlags(svc, fs, &cfg)
	allowed := fs.StringList("allowed-endpoint-dir", "directory plugin endpoints may live in (repeatable; default the root dir)")
	watchFlags(fs, &cfg)
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
	if cfg.APISocket == "" {
		cfg.APISocket = APISocket(abs, svc.Binary)
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-"+svc.Binary+":", err)
		return cfg, 2, false
	}
	if err := cfg.validateWatch(); err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-"+svc.Binary+":", err)
		return cfg, 2, false
	}
	cfg.AllowedDirs = *allowed
	if len(cfg.AllowedDirs) == 0 {
		cfg.AllowedDirs = []string{cfg.RootDir}
	}
	return cfg, 0, true
}

func healthcheck(svc Service, args []string) int {
	fs := NewFlags(svc.Binary)
	root := fs.String("root-dir", DefaultRootDir, "root directory")
	sock := fs.String("api-socket", "", "API socket of the instance to check (default <root-dir>/nodeplug/"+svc.Binary+".sock)")
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	addr := *sock
	if addr == "" {
		addr = APISocket(*root, svc.Binary)
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

// validate checks the listener flags against each other.
func (c *Config) validate() error {
	if c.ListenTCP != "" {
		if c.TLS.Insecure {
			if !isLoopback(c.ListenTCP) {
				return fmt.Errorf("--insecure-tcp serves only on loopback, not %s", c.ListenTCP)
			}
		} else if c.TLS.CertFile == "" || c.TLS.KeyFile == "" || c.TLS.ClientCAFile == "" {
			return errors.New("--listen-tcp needs mutual TLS: --tls-cert-file, --tls-key-file and --tls-client-ca-file")
		}
	}
	if c.Pprof && !isLoopback(c.MetricsListen) {
		return fmt.Errorf("--pprof is served only on a loopback --metrics-listen, not %q", c.MetricsListen)
	}
	return nil
}

// DialPeer returns a connection to a peer service at addr (a Unix socket
// path, or host:port over mutual TLS with this service's TLS flags).
func (c *Config) DialPeer(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return c.TLS.Dial(addr, opts...)
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

	apiGID, err := lookupGroup("api-group", cfg.APIGroup)
	if err != nil {
		return err
	}
	if err := makeRootDir(cfg.RootDir, apiGID); err != nil {
		return err
	}
	lock, err := lockfile.Acquire(filepath.Join(cfg.RootDir, name+".lock"))
	if errors.Is(err, lockfile.ErrLocked) {
		return fmt.Errorf("another %s runs with root dir %s: %w", name, cfg.RootDir, err)
	}
	if err != nil {
		return fmt.Errorf("%s cannot take its lock in root dir %s: %w", name, cfg.RootDir, err)
	}
	defer func() { _ = lock.Release() }()

	opGID, err := lookupGroup("operator-group", cfg.OperatorGroup)
	if err != nil {
		return err
	}
	creds := &access.Credentials{Unix: access.UnixPolicy{OwnUID: uint32(os.Getuid())}}
	if opGID >= 0 {
		creds.Unix.OperatorGIDs = []uint32{uint32(opGID)}
	}
	var tcp net.Listener
	if cfg.ListenTCP != "" {
		if cfg.TLS.Insecure {
			log.Warn("serving the API on TCP WITHOUT TLS (--insecure-tcp): every caller there may call everything; for tests only", "addr", cfg.ListenTCP)
		} else if creds.TLS, err = cfg.TLS.serverTLS(); err != nil {
			return err
		}
		if tcp, err = net.Listen("tcp", cfg.ListenTCP); err != nil {
			return fmt.Errorf("gRPC listen on %s: %w", cfg.ListenTCP, err)
		}
		defer tcp.Close()
	}
	lis, err := listenAPI(cfg.RootDir, cfg.APISocket, apiGID, log)
	if err != nil {
		return fmt.Errorf("API socket %s: %w", cfg.APISocket, err)
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

	guard := access.NewGuard(log, reg)
	if cfg.TLS.Insecure {
		guard.AllowUnidentified()
	}
	serverOpts := []grpc.ServerOption{grpc.Creds(creds),
		grpc.ChainUnaryInterceptor(guard.Unary),
		grpc.ChainStreamInterceptor(guard.Stream, access.NewWatchBounds(cfg.Watch, reg).Stream)}
	if svc.HandlerPool > 0 {
		serverOpts = append(serverOpts, grpc.NumStreamWorkers(uint32(svc.HandlerPool)))
	}
	server, healthSrv := rpcutil.NewServer(log, serverOpts...)
	healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(sctx)
	rt := &Runtime{Config: cfg, Log: log, Metrics: reg, Server: server, Health: healthSrv, Addr: lis.Addr(), group: g, ctx: gctx}
	if tcp != nil {
		rt.TCPAddr = tcp.Addr()
	}
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
	if svc.Settle != nil {
		rt.Go(func(ctx context.Context) error {
			settleLoop(ctx, *svc.Settle, log, reg)
			return nil
		})
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
	if tcp != nil {
		log.Info("gRPC listening on TCP", "service", name, "tcp_addr", tcp.Addr().String(), "mutual_tls", !cfg.TLS.Insecure)
		// The same server: stopping it (above) stops both listeners.
		rt.group.Go(func() error {
			if err := server.Serve(tcp); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("gRPC server on %s: %w", tcp.Addr(), err)
			}
			return nil
		})
	}
	err = g.Wait()
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}
