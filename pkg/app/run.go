package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/nodeplug/nodeplug/pkg/access"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/lockfile"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/version"
)

// Run runs svc with cfg until ctx ends or a background task fails. Its
// phases, in order: tracing; the root dir and the lock; every listener (so
// that a failure to bind leaves nothing behind, before Setup creates
// sockets); the API server; Setup; serving until the end.
func Run(ctx context.Context, svc Service, cfg Config, log *slog.Logger) error {
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
	release, err := takeRootDir(cfg, svc.Binary, apiGID)
	if err != nil {
		return err
	}
	defer release()

	l, err := listen(cfg, apiGID, log)
	if err != nil {
		return err
	}
	defer l.close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	server, healthSrv := newAPIServer(svc, cfg, l.creds, reg, log)
	err = serveUntilStopped(ctx, svc, cfg, l, reg, server, healthSrv, log)
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// takeRootDir creates the root dir (for the API socket's group apiGID) and
// takes the service's lock in it; release gives the lock back.
func takeRootDir(cfg Config, binary string, apiGID int) (release func(), err error) {
	name := "nodeplug-" + binary
	if err := makeRootDir(cfg.RootDir, apiGID); err != nil {
		return nil, err
	}
	lock, err := lockfile.Acquire(layout.LockFile(cfg.RootDir, binary))
	if errors.Is(err, lockfile.ErrLocked) {
		return nil, fmt.Errorf("another %s runs with root dir %s: %w", name, cfg.RootDir, err)
	}
	if err != nil {
		return nil, fmt.Errorf("%s cannot take its lock in root dir %s: %w", name, cfg.RootDir, err)
	}
	return func() { _ = lock.Release() }, nil
}

// listeners are a service's bound listeners and the credentials of its API
// server.
type listeners struct {
	api     net.Listener // the API's Unix socket
	tcp     net.Listener // --listen-tcp, or nil
	metrics net.Listener // --metrics-listen, or nil
	creds   *access.Credentials
}

// listen binds every listener of cfg: the API socket (with group apiGID),
// --listen-tcp with its TLS, and the metrics address. On an error nothing
// stays bound.
func listen(cfg Config, apiGID int, log *slog.Logger) (_ *listeners, err error) {
	opGID, err := lookupGroup("operator-group", cfg.OperatorGroup)
	if err != nil {
		return nil, err
	}
	l := &listeners{creds: &access.Credentials{Unix: access.UnixPolicy{OwnUID: uint32(os.Getuid())}}}
	if opGID >= 0 {
		l.creds.Unix.OperatorGIDs = []uint32{uint32(opGID)}
	}
	defer func() {
		if err != nil {
			l.close()
		}
	}()
	if cfg.ListenTCP != "" {
		if cfg.TLS.Insecure {
			log.Warn("serving the API on TCP WITHOUT TLS (--insecure-tcp): every caller there may call everything; for tests only", "addr", cfg.ListenTCP)
		} else if l.creds.TLS, err = cfg.TLS.serverTLS(); err != nil {
			return nil, err
		}
		if l.tcp, err = net.Listen("tcp", cfg.ListenTCP); err != nil {
			return nil, fmt.Errorf("gRPC listen on %s: %w", cfg.ListenTCP, err)
		}
	}
	if l.api, err = listenAPI(cfg.RootDir, cfg.APISocket, apiGID, log); err != nil {
		return nil, fmt.Errorf("API socket %s: %w", cfg.APISocket, err)
	}
	if cfg.MetricsListen != "" {
		if l.metrics, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			return nil, fmt.Errorf("metrics listen on %s: %w", cfg.MetricsListen, err)
		}
	}
	return l, nil
}

// close closes the listeners that are bound. Closing the API listener
// removes its socket (unixsock).
func (l *listeners) close() {
	for _, lis := range []net.Listener{l.metrics, l.api, l.tcp} {
		if lis != nil {
			_ = lis.Close()
		}
	}
}

// newAPIServer builds the API server: the caller's role from creds, the
// access guard, the Watch bounds, and the handler pool svc asks for. Its
// health is NOT_SERVING until the service is ready.
func newAPIServer(svc Service, cfg Config, creds *access.Credentials, reg *prometheus.Registry, log *slog.Logger) (*grpc.Server, *health.Server) {
	guard := access.NewGuard(log, reg)
	if cfg.TLS.Insecure {
		guard.AllowUnidentified()
	}
	server, healthSrv := rpcutil.NewServerPool(log, svc.HandlerPool, grpc.Creds(creds),
		grpc.ChainUnaryInterceptor(guard.Unary),
		grpc.ChainStreamInterceptor(guard.Stream, access.NewWatchBounds(cfg.Watch, reg).Stream))
	healthSrv.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	return server, healthSrv
}

// serveUntilStopped runs svc.Setup, then serves the API (on its socket and on TCP) and
// the metrics until ctx ends or a background task fails, and waits for
// everything to stop.
func serveUntilStopped(ctx context.Context, svc Service, cfg Config, l *listeners, reg *prometheus.Registry, server *grpc.Server, healthSrv *health.Server, log *slog.Logger) error {
	name := "nodeplug-" + svc.Binary
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(sctx)
	rt := &Runtime{Config: cfg, Log: log, Metrics: reg, Server: server, Health: healthSrv, Addr: l.api.Addr(), group: g, ctx: gctx, sup: newSupervisor(log)}
	if l.tcp != nil {
		rt.TCPAddr = l.tcp.Addr()
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
		rt.sup.ready(l.api.Addr().String())
	}
	if err := rt.superviseWatchdog(l.api.Addr()); err != nil {
		cancel()
		_ = g.Wait()
		return err
	}
	if svc.Settle != nil {
		rt.Go(func(ctx context.Context) error {
			SettleLoop(ctx, *svc.Settle, log, reg)
			return nil
		})
	}
	if l.metrics != nil {
		serveMetrics(rt, l.metrics, reg, cfg.Pprof)
	}
	log.Info("gRPC listening", "service", name, "addr", l.api.Addr().String(), "root_dir", cfg.RootDir, "version", version.Version)
	rt.serve(l.api, server, func() {
		log.Info("shutting down")
		rt.sup.stopping()
		healthSrv.Shutdown()
	})
	if l.tcp != nil {
		log.Info("gRPC listening on TCP", "service", name, "tcp_addr", l.tcp.Addr().String(), "mutual_tls", !cfg.TLS.Insecure)
		// The same server: stopping it (above) stops both listeners.
		rt.group.Go(func() error {
			if err := server.Serve(l.tcp); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("gRPC server on %s: %w", l.tcp.Addr(), err)
			}
			return nil
		})
	}
	return g.Wait()
}

// serveMetrics serves /metrics from reg (and, with withPprof, Go's profiles)
// on lis until the service stops.
func serveMetrics(rt *Runtime, lis net.Listener, reg *prometheus.Registry, withPprof bool) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	rt.Log.Info("metrics listening", "addr", lis.Addr().String(), "url", "http://"+lis.Addr().String()+"/metrics")
	rt.group.Go(func() error {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics server: %w", err)
		}
		return nil
	})
	rt.group.Go(func() error {
		<-rt.ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		return nil
	})
}
