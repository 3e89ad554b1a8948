// Command nodeplug-watcher watches <root-dir>/plugins_registry for plugin
// registration sockets and streams their appearance and removal over gRPC
// (nodeplug.watcher.v1.WatcherService).
//
// This file is the only place where the watcher's parts are wired together:
// flags → config → newService (the socket watcher, the gRPC adapter) →
// servers.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/watcher/internal/server"
	"github.com/nodeplug/nodeplug/services/watcher/internal/socketwatch"
)

func main() { os.Exit(app.Main(appService(), os.Args[1:])) }

// appService is the watcher as app.Main runs it: its name, defaults, flags
// (the common ones only) and setup.
func appService() app.Service {
	return app.Service{
		Binary:         "watcher",
		DefaultMetrics: app.DefaultWatcherMetricsAddr,
		Setup: func(_ context.Context, rt *app.Runtime) error {
			return setup(rt, config{
				Dir:         rt.Config.PluginsDir(),
				AllowedDirs: rt.Config.AllowedDirs,
				WatchLimits: rt.Config.WatchLimits(),
				Log:         rt.Log,
				Metrics:     rt.Metrics,
			})
		},
	}
}

// config is what the watcher is configured with.
type config struct {
	// Dir is the directory to watch (<root>/plugins_registry).
	Dir string
	// AllowedDirs decide which symlinked sockets count.
	AllowedDirs []string
	// WatchLimits bound the WatchSocketEvents streams: at most 64 open,
	// each at most 4096 events or 4 MiB behind, 32 MiB held by all of them
	// together (the stream package's defaults, for zero fields); past them,
	// RESOURCE_EXHAUSTED.
	WatchLimits stream.Limits
	Log         *slog.Logger
	Metrics     prometheus.Registerer
}

// service is the watcher's parts, wired together.
type service struct {
	watch *socketwatch.Watcher // the socket set and its subscribers
	api   *server.Server       // the gRPC adapter
}

// newService builds the watcher: it creates the directory if needed and
// reads the sockets already present; changes are followed once run is
// called.
func newService(cfg config) (*service, error) {
	conf, err := unixsock.NewConfiner(cfg.AllowedDirs)
	if err != nil {
		return nil, err
	}
	w, err := socketwatch.New(socketwatch.Options{
		Dir:        cfg.Dir,
		Confiner:   conf,
		Limits:     cfg.WatchLimits,
		Log:        cfg.Log,
		Registerer: cfg.Metrics,
	})
	if err != nil {
		return nil, err
	}
	return &service{watch: w, api: server.New(w)}, nil
}

// run follows the directory until ctx ends, then ends every stream.
func (s *service) run(ctx context.Context) error { return s.watch.Run(ctx) }

// setup serves the watcher's API on the runtime's server and runs the
// service.
func setup(rt *app.Runtime, cfg config) error {
	s, err := newService(cfg)
	if err != nil {
		return err
	}
	s.api.Register(rt.Server)
	rt.Go(s.run)
	return nil
}
