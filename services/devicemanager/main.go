// Command nodeplug-devicemanager owns device plugin endpoints, device
// health, allocations and the checkpoint. It accepts plugins through
// RegisterPlugin (from the reconciler) and the legacy kubelet.sock. It
// answers container starts and the pod resources API with its allocations
// and the DRA claims of nodeplug-dramanager, which it asks over DRAService
// (package draclient): the DRA half runs in a process of its own.
//
// This file is the only place where its parts are put together: flags →
// configuration → the store and the manager → the gRPC servers.
package main

import (
	"context"
	"errors"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/server"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/cdispec"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/containerstart"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/draclient"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/podresources"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

func main() { os.Exit(app.Main(appService(), os.Args[1:])) }

// appService is the devicemanager as app.Main runs it: its name, defaults,
// flags and setup. Nothing runs until app.Main parses the flags.
func appService() app.Service {
	var grace time.Duration
	var opts store.Options
	var draAddr string
	var cdi cdispec.Config
	var cdiDirs *[]string
	return app.Service{
		Binary: "devicemanager", DefaultMetrics: app.DefaultDeviceManagerMetricsAddr,
		Flags: func(fs *app.Flags) {
			fs.DurationVar(&grace, "grace-period", manager.DefaultGracePeriod, "how long a resource with no live endpoint keeps its capacity")
			fs.Int64Var(&opts.CompactAt, "checkpoint-compact-bytes", store.DefaultCompactAt,
				"journal size past which the checkpoint snapshot is rewritten in the background (or past the snapshot's size, if larger)")
			fs.StringVar(&draAddr, "dramanager-addr", "", "nodeplug-dramanager's API, asked for the DRA claims of a container start, of the pod resources API and of a pod's release: a Unix socket path, or host:port with mutual TLS (default <root-dir>/nodeplug/dramanager.sock)")
			fs.Var(app.GoneFlag(errResourceAPIListenGone), "resource-api-listen", "removed: the node-local resource API is nodeplug-apiserver's (its --resource-api-listen)")
			for _, name := range []string{"kubeconfig", "node-name", "dra-disconnect-delay"} {
				fs.Var(app.GoneFlag(draFlagGone(name)), name, "removed: the DRA half is nodeplug-dramanager's (its --"+name+")")
			}
			fs.StringVar(&cdi.Dir, "cdi-spec-dir", cdispec.DefaultDir,
				"where the CDI spec of each allocated container (its device plugins' envs, mounts and device nodes) is written")
			cdiDirs = fs.StringList("cdi-spec-dirs",
				"a CDI spec directory the names a container start returns must resolve in (repeatable; default "+strings.Join(cdispec.DefaultSearchDirs(), ", ")+"; --cdi-spec-dir is searched too)")
		},
		Setup: func(ctx context.Context, rt *app.Runtime) error {
			if len(*cdiDirs) > 0 {
				cdi.SearchDirs = *cdiDirs
			}
			if draAddr == "" {
				draAddr = layout.APISocket(rt.Config.RootDir, "dramanager")
			}
			return setup(ctx, rt, grace, opts, draAddr, cdi)
		},
		// In a burst of registrations every plugin allocates while the live
		// heap stays small (app.BurstGCPercent); once the burst settles the
		// manager collects and gives the memory back (manager.GiveBack).
		GCPercent: app.BurstGCPercent,
		// As many handlers as the reconciler's parallel registrations (its
		// executor runs 64, each a RegisterPlugin here): with fewer, the
		// calls past the pool start a fresh goroutine whose stack grows
		// again through the handler path (docs/performance.md).
		HandlerPool: 64,
	}
}

// setup refuses a live kubelet.sock, restores the state, removes stale
// sockets and makes the containers' CDI specs match the allocations
// (manager.Open), then serves the API, kubelet.sock and the pod resources
// socket (rate-limited as the kubelet's). A container's start, the pod
// resources API and a pod's release read or release the DRA claims of
// nodeplug-dramanager at draAddr (draclient); nothing else waits for it.
// The manager runs until the service stops, then flushes its state; it
// never deregisters plugins or releases allocations.
func setup(ctx context.Context, rt *app.Runtime, grace time.Duration, opts store.Options, draAddr string, cdi cdispec.Config) error {
	dir := rt.Config.DevicePluginsDir()
	opts.Log = rt.Log
	cdi.Log = rt.Log
	specs, err := cdispec.New(cdi)
	if err != nil {
		return err
	}
	m, err := manager.Open(ctx, manager.Config{
		DevicePluginsDir: dir, AllowedDirs: rt.Config.AllowedDirs, GracePeriod: grace,
		Store: store.New(dir, opts), Log: rt.Log, Registerer: rt.Metrics, WatchLimits: rt.Config.WatchLimits(),
		Specs: specs,
	})
	if err != nil {
		return err
	}
	rt.Go(m.Run)
	// Dialling connects lazily: the devicemanager serves whether the
	// dramanager is up or not, and a call that needs it says it is not.
	dconn, err := rt.Config.DialPeer(draAddr)
	if err != nil {
		return err
	}
	rt.Go(func(ctx context.Context) error { <-ctx.Done(); return dconn.Close() })
	cm := draclient.New(dconn, draAddr)
	starter := containerstart.New(m, cm, specs)
	dmv1.RegisterDeviceManagerServiceServer(rt.Server, server.NewService(m).WithClaims(cm).WithStarter(starter))
	kubeletSock := manager.KubeletSocketPath(dir)
	if err := rt.ServeUnix(kubeletSock, func(s *grpc.Server) {
		pluginapi.RegisterRegistrationServer(s, server.NewRegistration(m, dir, rt.Log))
	}); err != nil {
		return err
	}
	podSock := layout.PodResourcesSocket(rt.Config.RootDir)
	pr := podresources.New(m, rt.Metrics).WithClaims(cm)
	if err := rt.ServeUnix(podSock, func(s *grpc.Server) {
		podresourcesv1.RegisterPodResourcesListerServer(s, pr)
	}, server.RateLimit(pr.Limiter(podresources.DefaultQPS, podresources.DefaultBurst).Allow)); err != nil {
		return err
	}
	rt.Log.Info("devicemanager ready", "kubelet_sock", kubeletSock, "pod_resources_sock", podSock, "dramanager", draAddr,
		"instance_id", m.InstanceID(), "grace_period", m.GracePeriod(), "cdi_spec_dir", specs.Dir(), "cdi_spec_dirs", specs.SearchDirs())
	return nil
}

// errResourceAPIListenGone is what the devicemanager's former
// --resource-api-listen answers.
var errResourceAPIListenGone = errors.New("--resource-api-listen is gone from the devicemanager: the node-local resource API " +
	"is served by nodeplug-apiserver (its --resource-api-listen); nodeplug-dramanager reaches it through <root-dir>/nodeplug/kubeconfig-internal")

// draFlagGone is what a DRA flag the devicemanager had answers.
func draFlagGone(name string) error {
	return errors.New("--" + name + " is gone from the devicemanager: the DRA half (drivers, slices, claims) is served by nodeplug-dramanager; give it --" + name)
}
