// Command nodeplug-reconciler is nodeplug's plugin manager: it follows the
// watcher's socket events, registers each plugin (GetInfo, validation, the
// handler of its type, NotifyRegistrationStatus) and serves
// nodeplug.reconciler.v1.ReconcilerService.
package main

import (
	"context"
	"os"
	"time"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/stack"
)

func main() {
	var watcherAddr, dmAddr string
	var resync time.Duration
	os.Exit(app.Main(app.Service{
		Binary:         "reconciler",
		DefaultListen:  "127.0.0.1:50052",
		DefaultMetrics: "127.0.0.1:9452",
		Flags: func(fs *app.Flags) {
			fs.StringVar(&watcherAddr, "watcher-addr", "127.0.0.1:50051", "watcher gRPC address (host:port or absolute unix socket path)")
			fs.StringVar(&dmAddr, "devicemanager-addr", "127.0.0.1:50053", "devicemanager gRPC address (host:port or absolute unix socket path)")
			fs.DurationVar(&resync, "resync-period", 5*time.Minute, "safety-net reconcile interval (changes are reconciled at once)")
		},
		Setup: func(_ context.Context, rt *app.Runtime) error {
			s, err := stack.New(stack.Config{WatcherAddr: watcherAddr, DeviceManagerAddr: dmAddr, ResyncPeriod: resync, AllowedDirs: rt.Config.AllowedDirs, Log: rt.Log})
			if err != nil {
				return err
			}
			s.Service.Register(rt.Server)
			if err := s.Reconciler.RegisterMetrics(rt.Metrics); err != nil {
				return err
			}
			// Healthy once the watcher's first snapshot arrived, so that a
			// plugin started after the reconciler is healthy is a live
			// event (and its registration one trace from the watcher on).
			ready := rt.DeferReady()
			rt.Go(func(ctx context.Context) error {
				if s.Reconciler.WaitSynced(ctx) == nil {
					ready()
				}
				return nil
			})
			rt.Go(s.Run)
			return nil
		},
	}, os.Args[1:]))
}
