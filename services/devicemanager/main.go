// Command nodeplug-devicemanager owns device plugin endpoints, device
// health, allocations and the checkpoint. It accepts plugins through
// RegisterPlugin (from the reconciler) and the legacy kubelet.sock.
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
	resourcev1 "k8s.io/api/resource/v1"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/dra/claimalloc"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/dra/claims"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/dra/claimview"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/dra/drivers"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/dra/kubeaccess"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/dra/kubecache"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/dra/slicewatch"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/draserver"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/server"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/cdispec"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/containerstart"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/podresources"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/store"
)

func main() { os.Exit(app.Main(appService(), os.Args[1:])) }

// appService is the devicemanager as app.Main runs it: its name, defaults,
// flags and setup. Nothing runs until app.Main parses the flags.
func appService() app.Service {
	var grace time.Duration
	var opts store.Options
	var kube kubeaccess.Options
	var draDelay time.Duration
	var cdi cdispec.Config
	var cdiDirs *[]string
	return app.Service{
		Binary: "devicemanager", DefaultMetrics: app.DefaultDeviceManagerMetricsAddr,
		Flags: func(fs *app.Flags) {
			fs.DurationVar(&grace, "grace-period", manager.DefaultGracePeriod, "how long a resource with no live endpoint keeps its capacity")
			fs.Int64Var(&opts.CompactAt, "checkpoint-compact-bytes", store.DefaultCompactAt,
				"journal size past which the checkpoint snapshot is rewritten in the background (or past the snapshot's size, if larger)")
			fs.StringVar(&kube.Kubeconfig, "kubeconfig", "",
				"kubeconfig of a cluster's API server holding ResourceSlices, ResourceClaims and DeviceClasses; empty: the node-local resource API of nodeplug-apiserver, through the kubeconfig it writes under the root dir")
			fs.Var(app.GoneFlag(errResourceAPIListenGone), "resource-api-listen", "removed: the node-local resource API is nodeplug-apiserver's (its --resource-api-listen)")
			fs.StringVar(&kube.NodeName, "node-name", "", "the Node this devicemanager serves (default: the host name)")
			fs.DurationVar(&draDelay, "dra-disconnect-delay", drivers.DefaultDisconnectDelay,
				"how long a DRA driver may have no connected instance (and, after a start, to register again) before its ResourceSlices on this node are deleted")
			fs.StringVar(&cdi.Dir, "cdi-spec-dir", cdispec.DefaultDir,
				"where the CDI spec of each allocated container (its device plugins' envs, mounts and device nodes) is written")
			cdiDirs = fs.StringList("cdi-spec-dirs",
				"a CDI spec directory the names a container start returns must resolve in (repeatable; default "+strings.Join(cdispec.DefaultSearchDirs(), ", ")+"; --cdi-spec-dir is searched too)")
		},
		Setup: func(ctx context.Context, rt *app.Runtime) error {
			if len(*cdiDirs) > 0 {
				cdi.SearchDirs = *cdiDirs
			}
			return setup(ctx, rt, grace, opts, kube, draDelay, cdi)
		},
		// Half the collections of Go's default: in a burst of registrations
		// the live heap is small while every plugin allocates, so at
		// GOGC=100 the collector runs often (docs/performance.md has what
		// it cost). The extra garbage lasts only as long as the burst: once
		// the burst settles the manager collects and gives the memory back
		// (manager.GiveBack).
		GCPercent: 200,
		// As many handlers as the reconciler's parallel registrations (its
		// executor runs 64, each a RegisterPlugin here): with fewer, the
		// calls past the pool start a fresh goroutine whose stack grows
		// again through the handler path (docs/performance.md).
		HandlerPool: 64,
	}
}

// setup refuses a live kubelet.sock, restores the state, removes stale
// sockets and makes the containers' CDI specs match the allocations
// (manager.Open), opens the Kubernetes API and the DRA parts, then serves
// the API, kubelet.sock and the pod resources socket (rate-limited as the
// kubelet's). The state core and the DRA claims share one journal
// (claims.Journal); a container's start takes both (containerstart). The
// manager runs until the service stops, then flushes its state; it never
// deregisters plugins or releases allocations.
func setup(ctx context.Context, rt *app.Runtime, grace time.Duration, opts store.Options, kube kubeaccess.Options, draDelay time.Duration, cdi cdispec.Config) error {
	dir := rt.Config.DevicePluginsDir()
	opts.Log = rt.Log
	cdi.Log = rt.Log
	specs, err := cdispec.New(cdi)
	if err != nil {
		return err
	}
	journal := claims.NewJournal(store.New(dir, opts))
	m, err := manager.Open(ctx, manager.Config{
		DevicePluginsDir: dir, AllowedDirs: rt.Config.AllowedDirs, GracePeriod: grace,
		Store: journal, Log: rt.Log, Registerer: rt.Metrics, WatchLimits: rt.Config.WatchLimits(),
		Specs: specs,
	})
	if err != nil {
		return err
	}
	rt.Go(m.Run)
	kubeAPI, err := openKubeAPI(rt, kube)
	if err != nil {
		return err
	}
	cm, err := setupDRA(rt, m.InstanceID(), kubeAPI, draDelay, journal)
	if err != nil {
		return err
	}
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
	rt.Log.Info("devicemanager ready", "kubelet_sock", kubeletSock, "pod_resources_sock", podSock,
		"instance_id", m.InstanceID(), "grace_period", m.GracePeriod(), "cdi_spec_dir", specs.Dir(), "cdi_spec_dirs", specs.SearchDirs())
	return nil
}

// errResourceAPIListenGone is what the devicemanager's former
// --resource-api-listen answers.
var errResourceAPIListenGone = errors.New("--resource-api-listen is gone from the devicemanager: the node-local resource API " +
	"is served by nodeplug-apiserver (its --resource-api-listen); the devicemanager reaches it through <root-dir>/nodeplug/kubeconfig-internal")

// openKubeAPI opens the Kubernetes API the DRA parts use: the cluster's
// (--kubeconfig) or nodeplug-apiserver's node-local one.
func openKubeAPI(rt *app.Runtime, kube kubeaccess.Options) (*kubeaccess.Access, error) {
	kube.RootDir = rt.Config.RootDir
	a, err := kubeaccess.Open(kube)
	if err != nil {
		return nil, err
	}
	if a.Local {
		rt.Log.Info("using the node-local resource API of nodeplug-apiserver", "kubeconfig", a.Kubeconfig, "node", a.NodeName)
	} else {
		rt.Log.Info("using the Kubernetes API of the kubeconfig", "server", a.Config.Host, "kubeconfig", a.Kubeconfig, "node", a.NodeName)
	}
	return a, nil
}

// setupDRA serves DRAService: the DRA driver connections (their slices
// deleted through kubeAPI when a driver stays away), the informers of the
// objects the DRA half reads (kubecache: each kind once, shared by the
// claim allocator and the slices view), this node's ResourceSlices as
// streamed (slicewatch), and the claims manager (allocation on this node
// by claimalloc, the drivers' calls by the registry, its records in
// journal), which it returns; ListClaims joins its records with the API's
// claims (claimview).
func setupDRA(rt *app.Runtime, instanceID string, kubeAPI *kubeaccess.Access, delay time.Duration, journal *claims.Journal) (*claims.Manager, error) {
	kc, err := kubecache.New(kubeAPI.Client, kubeAPI.NodeName)
	if err != nil {
		return nil, err
	}
	slices := slicewatch.New(kc.NodeSlices, kubeAPI.Client, kubeAPI.NodeName, rt.Config.WatchLimits(), rt.Log)
	reg, err := drivers.New(drivers.Config{
		Client: kubeAPI.Client, NodeName: kubeAPI.NodeName, AllowedDirs: rt.Config.AllowedDirs,
		DisconnectDelay: delay, Log: rt.Log, Registerer: rt.Metrics, Slices: slices.Count,
	})
	if err != nil {
		return nil, err
	}
	reg.Start()
	rt.Go(func(ctx context.Context) error { <-ctx.Done(); reg.Close(); return nil })
	alloc, err := claimalloc.New(kubeAPI.Client, kubeAPI.NodeName, rt.Log)
	if err != nil {
		return nil, err
	}
	// The allocator's decisions read the node, its slices, the
	// DeviceClasses and the devices in use from kc's memory.
	alloc.Follow(kc)
	rt.Go(alloc.Run)
	rt.Go(slices.Run)
	rt.Go(kc.Run)
	node := kubeAPI.NodeName
	cm, err := claims.New(claims.Config{
		Reserver: alloc, Drivers: reg, Journal: journal, Log: rt.Log, Registerer: rt.Metrics,
		AllocatedHere: func(c *resourcev1.ResourceClaim) bool { return c.Annotations[claimalloc.AllocatedByAnnotation] == node },
	})
	if err != nil {
		return nil, err
	}
	// The owed unprepares stop with the service; they stay recorded and
	// resume at the next start.
	rt.Go(func(ctx context.Context) error { <-ctx.Done(); cm.Close(); return nil })
	view := claimview.New(kubeAPI.Client, node, cm, reg)
	dmv1.RegisterDRAServiceServer(rt.Server, draserver.NewService(instanceID, reg, slices, draserver.WithClaims(view)))
	return cm, nil
}
