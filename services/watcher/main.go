// Command nodeplug-watcher watches <root-dir>/plugins_registry for plugin
// registration sockets and streams their appearance and removal over gRPC
// (nodeplug.watcher.v1.WatcherService).
package main

import (
	"context"
	"os"

	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/watcher/internal/grpcapi"
	"github.com/nodeplug/nodeplug/services/watcher/internal/socketwatch"
)

func main() {
	os.Exit(app.Main(app.Service{
		Binary:         "watcher",
		DefaultListen:  "127.0.0.1:50051",
		DefaultMetrics: "127.0.0.1:9451",
		Setup:          setup,
	}, os.Args[1:]))
}

func setup(_ context.Context, rt *app.Runtime) error {
	conf, err := unixsock.NewConfiner(rt.Config.AllowedDirs)
	if err != nil {
		return err
	}
	w, err := socketwatch.New(socketwatch.Options{
		Dir:        rt.Config.PluginsDir(),
		Confiner:   conf,
		Log:        rt.Log,
		Registerer: rt.Metrics,
	})
	if err != nil {
		return err
	}
	watcherv1.RegisterWatcherServiceServer(rt.Server, grpcapi.New(w))
	rt.Go(w.Run)
	return nil
}
