// Package stack wires the reconciler's parts together (handlers,
// reconciler, watcher client, gRPC service), for the binary and for tests
// that run the whole service in-process.
package stack

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"

	devicemanagerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/clock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/handler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/reconciler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/service"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/watchclient"
)

// Config configures the reconciler service.
type Config struct {
	// WatcherAddr and DeviceManagerAddr are host:port or absolute Unix
	// socket paths.
	WatcherAddr       string
	DeviceManagerAddr string
	ResyncPeriod      time.Duration
	// AllowedDirs confine plugin endpoints (none: no confinement).
	AllowedDirs []string
	Log         *slog.Logger
	Clock       clock.Clock
	MaxParallel int
}

// Stack is a configured reconciler service.
type Stack struct {
	Reconciler *reconciler.Reconciler
	Drivers    *handler.Drivers
	Devices    *handler.DevicePlugin
	Watch      *watchclient.Client
	Service    *service.Service

	conns []*grpc.ClientConn
}

// New builds the service. Nothing is dialled until Run.
func New(cfg Config) (*Stack, error) {
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
	wconn, err := rpcutil.DialPeer(cfg.WatcherAddr)
	if err != nil {
		return nil, err
	}
	dconn, err := rpcutil.DialPeer(cfg.DeviceManagerAddr)
	if err != nil {
		_ = wconn.Close()
		return nil, err
	}
	s := &Stack{Drivers: handler.NewDrivers(), conns: []*grpc.ClientConn{wconn, dconn}}
	s.Devices = handler.NewDevicePlugin(devicemanagerv1.NewDeviceManagerServiceClient(dconn), cfg.Log.With("handler", handler.TypeDevicePlugin),
		func(_, _ string) { s.Reconciler.Reregister(handler.TypeDevicePlugin) })
	s.Reconciler = reconciler.New(reconciler.Options{
		Handlers: map[string]cache.Handler{
			handler.TypeDevicePlugin: s.Devices,
			handler.TypeCSIPlugin:    handler.NewCSI(s.Drivers),
			handler.TypeDRAPlugin:    handler.NewDRA(s.Drivers),
		},
		Log:          cfg.Log,
		Clock:        cfg.Clock,
		ResyncPeriod: cfg.ResyncPeriod,
		MaxParallel:  cfg.MaxParallel,
		Confiner:     confiner,
	})
	s.Watch = watchclient.New(watcherv1.NewWatcherServiceClient(wconn), s.Reconciler, cfg.Log)
	s.Service = service.New(s.Reconciler, s.Drivers)
	return s, nil
}

// Run runs the reconciler, the watcher client and the devicemanager watch
// until ctx ends, then closes the connections.
func (s *Stack) Run(ctx context.Context) error {
	defer func() {
		for _, c := range s.conns {
			_ = c.Close()
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return s.Reconciler.Run(gctx) })
	g.Go(func() error { return s.Watch.Run(gctx) })
	g.Go(func() error { return s.Devices.Run(gctx) })
	err := g.Wait()
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
