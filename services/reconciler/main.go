// Command nodeplug-reconciler is nodeplug's plugin manager: it follows the
// watcher's socket events, registers each plugin (GetInfo, validation, the
// handler of its type, NotifyRegistrationStatus) and serves
// nodeplug.reconciler.v1.ReconcilerService.
//
// This file is the only place where the reconciler's parts are wired
// together: flags → config → newService (the status board, the handlers,
// the control loop, the watcher client, the gRPC adapter) → servers.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/checkpoint"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/clock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/handler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/reconciler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/server"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/watchclient"
)

func main() { os.Exit(app.Main(appService(), os.Args[1:])) }

// appService is the reconciler as app.Main runs it: its name, defaults, flags
// and setup. Nothing runs until app.Main parses the flags.
func appService() app.Service {
	cfg := config{}
	return app.Service{
		Binary:         "reconciler",
		DefaultMetrics: app.DefaultReconcilerMetricsAddr,
		// In a burst of registrations the reconciler allocates for every
		// plugin while its live heap stays small (app.BurstGCPercent); once
		// the heap has been quiet for a second, the memory is given back.
		GCPercent: app.BurstGCPercent,
		Settle:    &app.Settle{},
		Flags: func(fs *app.Flags) {
			fs.StringVar(&cfg.WatcherAddr, "watcher-addr", "", "the watcher's API: a Unix socket path, or host:port with mutual TLS (default <root-dir>/nodeplug/watcher.sock)")
			fs.StringVar(&cfg.DeviceManagerAddr, "devicemanager-addr", "", "the devicemanager's API: a Unix socket path, or host:port with mutual TLS (default <root-dir>/nodeplug/devicemanager.sock)")
			fs.StringVar(&cfg.DRAManagerAddr, "dramanager-addr", "", "nodeplug-dramanager's API, which DRA drivers are registered with: a Unix socket path, or host:port with mutual TLS (default <root-dir>/nodeplug/dramanager.sock)")
			fs.DurationVar(&cfg.ResyncPeriod, "resync-period", reconciler.DefaultResyncPeriod, "safety-net reconcile interval (changes are reconciled at once)")
		},
		Setup: func(_ context.Context, rt *app.Runtime) error {
			if cfg.WatcherAddr == "" {
				cfg.WatcherAddr = layout.APISocket(rt.Config.RootDir, "watcher")
			}
			if cfg.DeviceManagerAddr == "" {
				cfg.DeviceManagerAddr = layout.APISocket(rt.Config.RootDir, "devicemanager")
			}
			if cfg.DRAManagerAddr == "" {
				cfg.DRAManagerAddr = layout.APISocket(rt.Config.RootDir, "dramanager")
			}
			cfg.RegistrationsFile = layout.RegistrationsFile(rt.Config.RootDir)
			cfg.Dial = rt.Config.DialPeer
			cfg.AllowedDirs = rt.Config.AllowedDirs
			cfg.WatchLimits = rt.Config.WatchLimits()
			cfg.Log = rt.Log
			return setup(rt, cfg)
		},
	}
}

// config is what the reconciler is configured with.
type config struct {
	// WatcherAddr, DeviceManagerAddr and DRAManagerAddr are absolute Unix
	// socket paths or host:port.
	WatcherAddr       string
	DeviceManagerAddr string
	DRAManagerAddr    string
	// Dial connects to a peer (rpcutil.DialPeer when nil; the binary's
	// applies its TLS flags to host:port addresses).
	Dial         func(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error)
	ResyncPeriod time.Duration
	// RegistrationsFile is where the registrations this reconciler made
	// are kept for its next start (none when empty: a restart registers
	// every plugin again, as the kubelet does).
	RegistrationsFile string
	// AllowedDirs confine plugin endpoints (none: no confinement).
	AllowedDirs []string
	// WatchLimits bound the WatchPlugins streams: how many may be open,
	// how far each may fall behind and what all of them hold together;
	// past them, RESOURCE_EXHAUSTED. Zero fields take the stream package's
	// defaults (stream.DefaultSubscribers, DefaultBuffer,
	// DefaultSubscriberBytes, DefaultBytes).
	WatchLimits stream.Limits
	Log         *slog.Logger
	// Clock drives backoff and resync; the wall clock when nil.
	Clock clock.Clock
	// RefusedWindow is how long a plugin socket that refuses connections
	// is redialled (reconciler.DefaultRefusedWindow when 0).
	RefusedWindow time.Duration
	// EndpointWait bounds the wait for a device plugin's endpoint that
	// does not exist yet (reconciler.DefaultEndpointWait when 0).
	EndpointWait time.Duration
	// MaxParallel bounds the registration operations holding a worker at
	// once (the executor's default when 0).
	MaxParallel int
}

// service is the reconciler's parts, wired together.
type service struct {
	status  *status.Board          // what the API publishes
	loop    *reconciler.Reconciler // the control loop
	drivers *handler.Drivers       // CSI and DRA drivers
	dm      *handler.DeviceManager // the devicemanager, as its handlers see it
	dra     *handler.DeviceManager // the dramanager, as the DRA handler sees it
	watch   *watchclient.Client    // feeds the loop from the watcher
	api     *server.Server         // the gRPC adapter
	ckpt    *checkpoint.File       // the registrations file; nil: none
	log     *slog.Logger

	conns []*grpc.ClientConn
}

// newService builds the reconciler. Nothing is dialled until run.
func newService(cfg config) (*service, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	var confiner *unixsock.Confiner
	if len(cfg.AllowedDirs) > 0 {
		var err error
		if confiner, err = unixsock.NewConfiner(cfg.AllowedDirs); err != nil {
			return nil, err
		}
	}
	if cfg.Dial == nil {
		cfg.Dial = rpcutil.DialPeer
	}
	wconn, err := cfg.Dial(cfg.WatcherAddr)
	if err != nil {
		return nil, err
	}
	dconn, err := cfg.Dial(cfg.DeviceManagerAddr)
	if err != nil {
		_ = wconn.Close()
		return nil, err
	}
	rconn, err := cfg.Dial(cfg.DRAManagerAddr)
	if err != nil {
		_ = wconn.Close()
		_ = dconn.Close()
		return nil, err
	}
	s := &service{
		status:  status.New(cfg.Clock, cfg.WatchLimits),
		drivers: handler.NewDrivers(),
		conns:   []*grpc.ClientConn{wconn, dconn, rconn},
		log:     cfg.Log,
	}
	if cfg.RegistrationsFile != "" {
		// A file that cannot be read costs only this: its plugins
		// register again, from GetInfo on.
		ckpt, err := checkpoint.Open(cfg.RegistrationsFile, checkpoint.Options{Log: cfg.Log})
		if err != nil {
			cfg.Log.Warn("the registrations file of the last run cannot be read; every plugin registers again", "error", err)
		}
		s.ckpt = ckpt
	}
	// A restarted devicemanager lost its endpoints: register every device
	// plugin with it again; a restarted dramanager, every DRA driver.
	s.dm = handler.NewDeviceManager(dconn, cfg.Log.With("peer", "devicemanager"),
		func(_, _ string) { s.loop.Reregister(handler.TypeDevicePlugin) })
	s.dra = handler.NewDRAManager(rconn, cfg.Log.With("peer", "dramanager"),
		func(_, _ string) { s.loop.Reregister(handler.TypeDRAPlugin) })
	// A registration recovered from the last run waits for its peer to be
	// reachable; a pass follows each time one becomes so.
	s.dm.OnReady(func() { s.loop.Wake() })
	s.dra.OnReady(func() { s.loop.Wake() })
	// What ListResources says of an endpoint, ListPlugins says of its
	// registration (DESIGN "Reconciler ↔ devicemanager").
	s.dm.OnEndpoint(func(e handler.EndpointState) {
		switch {
		case e.Stopped:
			s.status.EndpointStopped(e.SocketPath, e.Generation, endpointStoppedNote(e))
		case e.Live:
			s.status.EndpointLive(e.SocketPath, e.Generation)
		}
	})
	s.loop = reconciler.New(reconciler.Options{
		Handlers: map[string]cache.Handler{
			handler.TypeDevicePlugin: handler.NewDevicePlugin(s.dm),
			handler.TypeCSIPlugin:    handler.NewCSI(s.drivers, confiner),
			handler.TypeDRAPlugin:    handler.NewDRA(s.drivers, s.dra),
		},
		Status:        s.status,
		Log:           cfg.Log,
		Clock:         cfg.Clock,
		ResyncPeriod:  cfg.ResyncPeriod,
		Confiner:      confiner,
		RefusedWindow: cfg.RefusedWindow,
		MaxParallel:   cfg.MaxParallel,
		Checkpoint:    s.ckpt,
		EndpointWait:  cfg.EndpointWait,
	})
	s.watch = watchclient.New(watcherv1.NewWatcherServiceClient(wconn), s.loop, cfg.Log)
	s.api = server.New(s.status, s.drivers)
	return s, nil
}

// run runs the control loop, the watcher client, the devicemanager and
// dramanager watches and the registrations file's writer until ctx ends,
// then writes the registrations file, ends the API's streams and closes
// the connections.
func (s *service) run(ctx context.Context) error {
	defer s.close()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.loop.Run(gctx) })
	g.Go(func() error { return s.watch.Run(gctx) })
	g.Go(func() error { return s.dm.Run(gctx) })
	g.Go(func() error { return s.dra.Run(gctx) })
	if s.ckpt != nil {
		g.Go(func() error { return s.ckpt.Run(gctx) })
	}
	err := g.Wait()
	if s.ckpt != nil {
		// Every operation has ended: what they changed is written now,
		// so that the next reconciler adopts it.
		if ferr := s.ckpt.Flush(); ferr != nil {
			s.log.Warn("writing the registrations file at exit failed; the next start registers the plugins it misses again", "error", ferr)
		}
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// close ends the API's streams and closes the connections to the peers.
func (s *service) close() {
	s.status.Close()
	for _, c := range s.conns {
		_ = c.Close()
	}
}

// setup serves the reconciler's API and metrics on the runtime's server
// and runs the service. Health stays NOT_SERVING until the watcher's first
// snapshot arrived, so that a plugin started after the reconciler is
// healthy is a live event (and its registration one trace from the watcher
// on).
func setup(rt *app.Runtime, cfg config) error {
	s, err := newService(cfg)
	if err != nil {
		return err
	}
	s.api.Register(rt.Server)
	if err := s.loop.RegisterMetrics(rt.Metrics); err != nil {
		s.close()
		return err
	}
	if err := s.status.RegisterMetrics(rt.Metrics); err != nil {
		s.close()
		return err
	}
	ready := rt.DeferReady()
	rt.Go(func(ctx context.Context) error {
		if s.loop.WaitSynced(ctx) == nil {
			ready()
		}
		return nil
	})
	rt.Go(s.run)
	return nil
}

// endpointStoppedNote is the last error of a registered device plugin whose
// endpoint stopped serving.
func endpointStoppedNote(e handler.EndpointState) string {
	note := fmt.Sprintf("device plugin endpoint %s stopped", e.Endpoint)
	if !e.StoppedTime.IsZero() {
		note += " at " + e.StoppedTime.UTC().Format(time.RFC3339)
	}
	return note + fmt.Sprintf(": resource %s has no allocatable devices from it until the plugin serves again (the devicemanager keeps its capacity for the grace period)", e.Resource)
}
