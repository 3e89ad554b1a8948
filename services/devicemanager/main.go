// Command nodeplug-devicemanager owns device plugin endpoints, device
// health, allocations and the checkpoint. It accepts plugins through
// RegisterPlugin (from the reconciler) and the legacy kubelet.sock.
package main

import (
	"context"
	"os"
	"time"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/manager"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/server"
)

func main() {
	var grace time.Duration
	os.Exit(app.Main(app.Service{
		Binary: "devicemanager", DefaultListen: "127.0.0.1:50053", DefaultMetrics: "127.0.0.1:9453",
		Flags: func(fs *app.Flags) {
			fs.DurationVar(&grace, "grace-period", manager.DefaultGracePeriod, "how long a resource with no live endpoint keeps its capacity")
		},
		Setup: func(ctx context.Context, rt *app.Runtime) error {
			d, err := server.Start(ctx, server.Options{
				DevicePluginsDir: rt.Config.DevicePluginsDir(), AllowedDirs: rt.Config.AllowedDirs,
				GracePeriod: grace, Log: rt.Log, Registerer: rt.Metrics,
			})
			if err != nil {
				return err
			}
			dmv1.RegisterDeviceManagerServiceServer(rt.Server, d.Service)
			rt.Go(d.Run)
			return nil
		},
	}, os.Args[1:]))
}
