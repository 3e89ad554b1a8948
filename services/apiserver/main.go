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
	"github.com/nodeplug/nodeplug/services/apiserver/internal/resourceapi"
)

func main() { os.Exit(app.Main(appService(), os.Args[1:])) }

// appService is nodeplug-apiserver as app.Main runs it: its name, defaults,
// flags and setup. Nothing runs until app.Main parses the flags.
func appService() app.Service {
	opts := localapi.Options{Limits: resourceapi.Limits{}.WithDefaults()}
	return app.Service{
		Binary: "apiserver", DefaultMetrics: app.DefaultAPIServerMetricsAddr,
		// What drivers write is large and short-lived (a slice replaced
		// by the next): collect at half Go's default growth, and give the
		// memory of a burst back once it is over.
		GCPercent: 50,
		Settle:    &app.Settle{},
		Flags: func(fs *app.Flags) {
			fs.StringVar(&opts.Listen, "resource-api-listen", localapi.DefaultListen,
				"loopback address of the node-local resource API (HTTPS; port 0: a free port, kept across restarts)")
			fs.StringVar(&opts.NodeName, "node-name", "", "the one Node the API serves (default: the host name; the dramanager's --node-name must match)")
			limitFlags(fs, &opts.Limits)
		},
		Setup: func(_ context.Context, rt *app.Runtime) error {
			return setup(rt, opts)
		},
	}
}

// limitFlags are the bounds of the resource API's watches (see
// resourceapi.Limits).
func limitFlags(fs *app.Flags, l *resourceapi.Limits) {
	fs.IntVar(&l.HistoryEvents, "resource-api-watch-history-events", l.HistoryEvents, "changes the watch history keeps, for watches that start from a resourceVersion (older: 410 Gone, the client lists again)")
	fs.Var((*resourceapi.Bytes)(&l.HistoryBytes), "resource-api-watch-history-bytes", "bytes of objects (encoded) the watch history keeps, e.g. 32Mi")
	fs.DurationVar(&l.HistoryAge, "resource-api-watch-history-age", l.HistoryAge, "how long the watch history keeps a change")
	fs.IntVar(&l.WatchBufferEvents, "resource-api-watch-buffer-events", l.WatchBufferEvents, "changes a watch may fall behind before it is cut off (its client watches again)")
	fs.Var((*resourceapi.Bytes)(&l.WatchBufferBytes), "resource-api-watch-buffer-bytes", "bytes of changes a watch may fall behind before it is cut off, at least the largest object (1.5Mi)")
	fs.IntVar(&l.MaxWatches, "resource-api-max-watches", l.MaxWatches, "watches open at once in total; one more is 429")
	fs.IntVar(&l.MaxWatchesPerCaller, "resource-api-max-watches-per-caller", l.MaxWatchesPerCaller, "watches open at once per caller (a client certificate's name: every driver shares one); one more is 429")
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
