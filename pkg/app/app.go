package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/pkg/version"
)

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
func (c *Config) PluginsDir() string { return layout.PluginsRegistryDir(c.RootDir) }

// DevicePluginsDir is <root>/device-plugins.
func (c *Config) DevicePluginsDir() string { return layout.DevicePluginsDir(c.RootDir) }

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
	// default, 100. GOGC, when set, always wins. The services on the
	// registration path run at BurstGCPercent.
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
	sup      *supervisor
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
		rt.sup.ready(rt.Addr.String())
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

// BurstGCPercent is the garbage collector's target of the services a
// registration passes through (the reconciler, the devicemanager and the
// dramanager): a quarter of the collections of Go's default. In a burst of
// registrations their live heap is small while every plugin allocates, so
// the collector runs often: at GOGC=200 it was 7–10% of their CPU
// in a burst, and its assists held registrations back at 1,000 plugins
// (docs/performance.md has the measurements). The heap grows further
// between collections only while a burst lasts: once it is over the
// service collects and gives the memory back (Settle, the devicemanager's
// GiveBack). Their memory at rest moves little (3% for the devicemanager
// with 1,000 plugins); a burst's peak is higher.
const BurstGCPercent = 400

// gcPercent returns the GOGC that svc.GCPercent asks for, unless the
// environment sets GOGC itself or the service keeps Go's default.
func gcPercent(svc Service, getenv func(string) string) (int, bool) {
	if svc.GCPercent == 0 || getenv("GOGC") != "" {
		return 0, false
	}
	return svc.GCPercent, true
}

func commonFlags(svc Service, fs *Flags, cfg *Config) *bool {
	AbsPathVar(fs.FlagSet, &cfg.RootDir, "root-dir", layout.DefaultRootDir, "root directory: plugins_registry/, device-plugins/ and nodeplug/ (the API sockets) are beneath it; a relative one is below the working directory")
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

// serviceFlags defines every flag of svc's binary on a new flag set: the
// flags every service takes (storing into cfg), then svc's own
// (svc.Flags). It returns where --version and --allowed-endpoint-dir land.
func serviceFlags(svc Service, cfg *Config) (fs *Flags, showVersion *bool, allowed *[]string) {
	fs = NewFlags(svc.Binary)
	showVersion = commonFlags(svc, fs, cfg)
	allowed = fs.StringList("allowed-endpoint-dir", "directory plugin endpoints may live in (repeatable; default the root dir)")
	watchFlags(fs, cfg)
	if svc.Flags != nil {
		svc.Flags(fs)
	}
	return fs, showVersion, allowed
}

func parse(svc Service, args []string) (Config, int, bool) {
	cfg := Config{Binary: svc.Binary}
	fs, showVersion, allowed := serviceFlags(svc, &cfg)
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
		cfg.APISocket = layout.APISocket(abs, svc.Binary)
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

// healthcheckFlags defines the flags of "healthcheck" on a new flag set
// and returns where they land.
func healthcheckFlags(svc Service) (fs *Flags, root, sock *string) {
	fs = NewFlags(svc.Binary)
	root = new(string)
	AbsPathVar(fs.FlagSet, root, "root-dir", layout.DefaultRootDir, "root directory")
	sock = fs.String("api-socket", "", "API socket of the instance to check (default <root-dir>/nodeplug/"+svc.Binary+".sock)")
	return fs, root, sock
}

func healthcheck(svc Service, args []string) int {
	fs, root, sock := healthcheckFlags(svc)
	fs.SetOutput(io.Discard)
	if err := fs.Parse(args); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	addr := *sock
	if addr == "" {
		addr = layout.APISocket(*root, svc.Binary)
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
