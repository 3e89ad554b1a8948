// Command nodeplug-apiserver serves the node-local resource API: the
// resource.k8s.io objects (ResourceSlices, ResourceClaims, DeviceClasses)
// and the one Node that DRA drivers and the devicemanager need when there
// is no cluster. It speaks HTTPS on loopback to clients holding the
// kubeconfigs it writes under <root>/nodeplug/, and keeps its objects in
// <root>/nodeplug/resource-api.db. With a cluster (the devicemanager's
// --kubeconfig) it is not run.
//
// It is a process of its own so that what drivers and readers send it
// cannot take the devicemanager's memory: a crash or an OOM here leaves
// allocation, pod resources and container start serving.
//
// This file is the only place where its parts are wired together: flags →
// options → the API (localapi) → serving.
package main

import (
	"context"
	"os"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/services/apiserver/internal/localapi"
)

func main() {
	var opts localapi.Options
	os.Exit(app.Main(app.Service{
		Binary: "apiserver", DefaultMetrics: app.DefaultAPIServerMetricsAddr,
		Flags: func(fs *app.Flags) {
			fs.StringVar(&opts.Listen, "resource-api-listen", localapi.DefaultListen,
				"loopback address of the node-local resource API (HTTPS; port 0: a free port, kept across restarts)")
			fs.StringVar(&opts.NodeName, "node-name", "", "the one Node the API serves (default: the host name; the devicemanager's --node-name must match)")
		},
		Setup: func(_ context.Context, rt *app.Runtime) error {
			return setup(rt, opts)
		},
	}, os.Args[1:]))
}

// setup opens the store, the credentials and the listener, and serves the
// API until the service stops.
func setup(rt *app.Runtime, opts localapi.Options) error {
	opts.RootDir, opts.Log, opts.Registerer = rt.Config.RootDir, rt.Log, rt.Metrics
	a, err := localapi.Open(opts)
	if err != nil {
		return err
	}
	rt.Go(a.Serve)
	rt.Log.Info("serving the node-local resource API", "addr", a.Addr, "node", a.NodeName,
		"kubeconfig", localapi.KubeconfigPath(opts.RootDir, localapi.Driver),
		"devicemanager_kubeconfig", localapi.KubeconfigPath(opts.RootDir, localapi.Internal))
	return nil
}
