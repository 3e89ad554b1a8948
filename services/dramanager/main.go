// Command nodeplug-dramanager is nodeplug's DRA half: the connections to
// DRA drivers, the ResourceSlices they publish for this node, and the
// ResourceClaims of this node's pods, allocated with the scheduler's
// structured allocator, prepared and unprepared by the drivers and kept
// in a crash-safe journal of their own (the kubelet's pkg/kubelet/cm/dra).
// It is the only nodeplug service that reads the Kubernetes API, so the
// device-plugin half (nodeplug-devicemanager) links none of client-go.
//
// This file is the only place where its parts are put together: flags →
// configuration → the journal, the Kubernetes API and the claims manager →
// DRAService.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	resourcev1 "k8s.io/api/resource/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimview"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/draserver"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubecache"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/podworker"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/slicewatch"
	"github.com/nodeplug/nodeplug/services/internal/containers"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

func main() { os.Exit(app.Main(appService(), os.Args[1:])) }

// appService is the dramanager as app.Main runs it: its name, defaults,
// flags and setup. Nothing runs until app.Main parses the flags.
func appService() app.Service {
	var opts store.Options
	var kube kubeaccess.Options
	var draDelay time.Duration
	var ctr runtimeOptions
	return app.Service{
		Binary: "dramanager", DefaultMetrics: app.DefaultDRAManagerMetricsAddr,
		// In a burst of driver registrations every RegisterDRADriver and
		// every driver connection allocates while the live heap stays small
		// (app.BurstGCPercent); once the heap has been quiet for a second,
		// the memory is given back.
		GCPercent: app.BurstGCPercent,
		Settle:    &app.Settle{},
		// As many handlers as the reconciler's parallel registrations (its
		// executor runs 64, each a RegisterDRADriver here), so that none
		// starts a fresh goroutine whose stack grows again.
		HandlerPool: 64,
		Flags: func(fs *app.Flags) {
			fs.Int64Var(&opts.CompactAt, "checkpoint-compact-bytes", store.DefaultCompactAt,
				"journal size past which the claims' checkpoint snapshot (<root-dir>/"+layout.DRAManagerDirName+") is rewritten in the background (or past the snapshot's size, if larger)")
			fs.StringVar(&kube.Kubeconfig, "kubeconfig", "",
				"kubeconfig of a cluster's API server holding ResourceSlices, ResourceClaims and DeviceClasses; empty: the node-local resource API of nodeplug-apiserver, through the kubeconfig it writes under the root dir")
			fs.StringVar(&kube.NodeName, "node-name", "", "the Node this dramanager serves (default: the host name)")
			fs.DurationVar(&draDelay, "dra-disconnect-delay", drivers.DefaultDisconnectDelay,
				"how long a DRA driver may have no connected instance (and, after a start, to register again) before its ResourceSlices on this node are deleted")
			fs.StringVar(&ctr.kind, "container-runtime", runtimeAuto,
				"what runs the containers of the node-local API's Pods: podman, docker, none (their devices are prepared, and nodeplugctl start prints what a runtime would be given), or auto (when the dramanager runs as root: podman when it answers, else docker when its engine answers, else none)")
			fs.StringVar(&ctr.podman, "podman-path", "", "the podman executable (default: podman on PATH)")
			fs.StringVar(&ctr.docker, "docker-path", "", "the docker executable, the CLI of the engine that runs the containers with --container-runtime docker (default: docker on PATH)")
			fs.StringVar(&ctr.devicemanager, "devicemanager-addr", "", "nodeplug-devicemanager's API, asked by the pod worker to allocate the pods' device-plugin resources and for what their containers start with: a Unix socket path, or host:port with mutual TLS (default <root-dir>/nodeplug/devicemanager.sock)")
			fs.StringVar(&ctr.network, "container-network", "", "the network of the pods' containers, as podman run --network and docker run --network take it (default: the runtime's; none: a loopback interface only)")
			fs.StringVar(&ctr.podmanNetwork, "podman-network", "", "the older name of --container-network, still accepted")
			ctr.cdiDirs = fs.StringList("docker-cdi-spec-dirs",
				"a directory where the CDI devices of the pods' containers are resolved when the runtime is a docker engine that does not resolve them itself (before Docker 25, or with CDI not enabled) (default /etc/cdi and /var/run/cdi)")
		},
		Setup: func(ctx context.Context, rt *app.Runtime) error {
			return setup(rt, opts, kube, draDelay, ctr)
		},
	}
}

// setup opens the claims' journal (importing, once, the claims an older
// devicemanager recorded in its own), the Kubernetes API and the DRA
// parts, and serves DRAService. The claims manager runs until the service
// stops; what it owes (unprepares, rollbacks of intents) stays recorded
// and resumes at the next start.
func setup(rt *app.Runtime, opts store.Options, kube kubeaccess.Options, draDelay time.Duration, ctr runtimeOptions) error {
	opts.Log = rt.Log
	journal, err := openJournal(rt, opts)
	if err != nil {
		return err
	}
	kubeAPI, err := openKubeAPI(rt, kube)
	if err != nil {
		return err
	}
	var pods podOptions
	if kubeAPI.Local {
		if pods.runtime, err = ctr.open(rt); err != nil {
			return err
		}
		if pods.devices, err = ctr.dialDevices(rt); err != nil {
			return err
		}
	}
	return setupDRA(rt, uuid.NewString(), kubeAPI, draDelay, journal, pods)
}

// openJournal opens and loads the claims' journal in
// <root>/dra-manager. A journal damaged past trust is moved aside (and
// logged), as the devicemanager's is: the claims it held are then unknown
// here and their drivers keep them prepared. When the directory holds no
// state yet and the devicemanager's checkpoint holds claims (a
// devicemanager from before the DRA half had its own process recorded
// them), they are imported first.
func openJournal(rt *app.Runtime, opts store.Options) (*claims.Journal, error) {
	dir := layout.DRAManagerDir(rt.Config.RootDir)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("creating the claims' checkpoint directory: %w", err)
	}
	journal := claims.NewJournal(store.New(dir, opts))
	d, err := journal.Load()
	if err != nil {
		if !errors.Is(err, store.ErrCorrupt) {
			return nil, err
		}
		rt.Log.Error("the claims' checkpoint was damaged and moved aside; claims it held are no longer known here", "dir", dir, "error", err)
	}
	if d == nil && err == nil {
		if err := importClaims(rt, journal); err != nil {
			return nil, err
		}
	}
	return journal, nil
}

// importClaims copies the claim records of the devicemanager's checkpoint
// (read, never changed) into journal, which holds nothing yet.
func importClaims(rt *app.Runtime, journal *claims.Journal) error {
	dmDir := rt.Config.DevicePluginsDir()
	old, err := store.ReadState(dmDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("reading the DRA claims an older devicemanager recorded in %s: %w", dmDir, err)
	}
	if old == nil || len(old.Claims) == 0 {
		return nil
	}
	if err := journal.Import(old.Claims); err != nil {
		return fmt.Errorf("importing the DRA claims an older devicemanager recorded in %s: %w", dmDir, err)
	}
	rt.Log.Info("imported the DRA claims an older devicemanager recorded", "from", dmDir, "claims", len(old.Claims))
	return nil
}

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

// permissionsHealth is the gRPC health service that says whether the
// cluster's API grants the dramanager every permission it needs: UNKNOWN
// until the start check completes, then SERVING, or NOT_SERVING when one
// is missing. The service's own health ("") does not follow it: the
// drivers, the prepared claims and their releases need no permission.
const permissionsHealth = "nodeplug.dramanager.KubernetesAPIPermissions"

// checkPermissions runs the start check in the background: who the API
// takes the dramanager to be, and whether it grants each permission of
// kubeaccess.Required (logged, in the metrics and in permissionsHealth).
func checkPermissions(rt *app.Runtime, kubeAPI *kubeaccess.Access) {
	rt.Health.SetServingStatus(permissionsHealth, healthpb.HealthCheckResponse_UNKNOWN)
	check := kubeaccess.NewChecker(kubeAPI, kubeaccess.CheckConfig{
		Log: rt.Log, Registerer: rt.Metrics,
		Done: func(missing []kubeaccess.Rule) {
			st := healthpb.HealthCheckResponse_SERVING
			if len(missing) > 0 {
				st = healthpb.HealthCheckResponse_NOT_SERVING
			}
			rt.Health.SetServingStatus(permissionsHealth, st)
		},
	})
	rt.Go(check.Run)
}

// setupDRA serves DRAService: the DRA driver connections (their slices
// deleted through kubeAPI when a driver stays away), the informers of the
// objects the DRA half reads (kubecache: each kind once, shared by the
// claim allocator and the slices view), this node's ResourceSlices as
// streamed (slicewatch), and the claims manager (allocation on this node
// by claimalloc, the drivers' calls by the registry, its records in
// journal); ListClaims joins its records with the API's claims (claimview).
func setupDRA(rt *app.Runtime, instanceID string, kubeAPI *kubeaccess.Access, delay time.Duration, journal *claims.Journal, pods podOptions) error {
	// With the node-local API, no scheduler applies the DeviceTaintRules:
	// the allocator does.
	var cacheOpts []kubecache.Option
	if kubeAPI.Local {
		cacheOpts = append(cacheOpts, kubecache.WithTaintRules())
	}
	kc, err := kubecache.New(kubeAPI.Client, kubeAPI.NodeName, cacheOpts...)
	if err != nil {
		return err
	}
	slices := slicewatch.New(kc.NodeSlices, kubeAPI.Client, kubeAPI.NodeName, rt.Config.WatchLimits(), rt.Log)
	slices.Explain(kubeAPI.Identity, func() error { return kc.LastError(kc.NodeSlices) })
	reg, err := drivers.New(drivers.Config{
		Client: kubeAPI.Client, NodeName: kubeAPI.NodeName, Identity: kubeAPI.Identity, AllowedDirs: rt.Config.AllowedDirs,
		DisconnectDelay: delay, Log: rt.Log, Registerer: rt.Metrics, Slices: slices.Count,
	})
	if err != nil {
		return err
	}
	reg.Start()
	rt.Go(func(ctx context.Context) error { <-ctx.Done(); reg.Close(); return nil })
	alloc, err := claimalloc.New(kubeAPI.Client, kubeAPI.NodeName, rt.Log)
	if err != nil {
		return err
	}
	alloc.SetIdentity(kubeAPI.Identity)
	if kubeAPI.Local {
		alloc.FollowTaintRules()
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
		return err
	}
	// The owed unprepares stop with the service; they stay recorded and
	// resume at the next start. The journal is flushed and closed after
	// them.
	rt.Go(func(ctx context.Context) error {
		<-ctx.Done()
		cm.Close()
		if err := journal.Flush(); err != nil {
			rt.Log.Error("flushing the claims' checkpoint", "error", err)
		}
		return nil
	})
	checkPermissions(rt, kubeAPI)
	// On a cluster's API, ListClaims lists this node's claims unless asked
	// for all; the view takes the releases to forget the pods' failures.
	view := claimview.New(kubeAPI.Client, node, cm, reg, claimview.SharedAPI(!kubeAPI.Local), claimview.WithIdentity(kubeAPI.Identity))
	dmv1.RegisterDRAServiceServer(rt.Server, draserver.NewService(instanceID, reg, slices, draserver.WithClaims(view), draserver.WithPods(view)))
	if kubeAPI.Local {
		// With the node-local API, nodeplug is the control plane of its
		// one node: the Pods there are run as a cluster would run them.
		pw, err := podworker.New(podworker.Config{
			Client: kubeAPI.Client, Node: node, Claims: view, Log: rt.Log,
			StateFile: filepath.Join(layout.DRAManagerDir(rt.Config.RootDir), "pods.json"),
			Runtime:   pods.runtime, Devices: pods.devices, RootDir: rt.Config.RootDir,
			// DeviceTaintRules and slices' NoExecute taints evict pods,
			// as a cluster's device taint eviction controller does.
			Taints: alloc,
		})
		if err != nil {
			return err
		}
		rt.Go(pw.Run)
	}
	rt.Log.Info("dramanager ready", "instance_id", instanceID, "checkpoint", journal.Location(), "node", node)
	return nil
}

// The values of --container-runtime.
const (
	runtimeAuto   = "auto"
	runtimePodman = "podman"
	runtimeDocker = "docker"
	runtimeNone   = "none"
)

// runtimeOptions are the flags that choose the pods' container runtime.
type runtimeOptions struct {
	kind, podman, docker, network, podmanNetwork string
	cdiDirs                                      *[]string
	// devicemanager is the devicemanager's address.
	devicemanager string
}

// noRuntime is logged when the pods' containers are not run.
const noRuntime = "no container runtime: the pods' devices are prepared, their containers are not run"

// open returns the runtime the flags name (nil: none). With auto, when
// the dramanager runs as root, podman is used when it answers, else
// docker when its engine answers; otherwise why is logged and the pods'
// containers are not run. (Asked by another user, podman runs rootless:
// it starts a pause process of that user's that outlives the dramanager,
// and host devices are not its to give.)
func (o runtimeOptions) open(rt *app.Runtime) (containers.Runtime, error) {
	network := o.network
	if o.podmanNetwork != "" {
		if network != "" && network != o.podmanNetwork {
			return nil, fmt.Errorf("--container-network %q and --podman-network %q: give one", network, o.podmanNetwork)
		}
		network = o.podmanNetwork
	}
	var cdiDirs []string
	if o.cdiDirs != nil {
		cdiDirs = *o.cdiDirs
	}
	podman := func() (containers.Runtime, error) {
		p, err := containers.NewPodman(containers.PodmanConfig{Path: o.podman, Network: network})
		if err != nil {
			return nil, err
		}
		return p, nil
	}
	docker := func() (containers.Runtime, error) {
		d, err := containers.NewDocker(containers.DockerConfig{Path: o.docker, Network: network, CDISpecDirs: cdiDirs})
		if err != nil {
			return nil, err
		}
		if !d.EngineCDI() {
			rt.Log.Info("the docker engine does not resolve CDI devices: they are resolved here", "cdi_spec_dirs", cdiDirsOr(cdiDirs))
		}
		return d, nil
	}
	var r containers.Runtime
	var err error
	switch o.kind {
	case runtimeNone:
		return nil, nil
	case runtimeAuto:
		if os.Geteuid() != 0 {
			rt.Log.Info(noRuntime, "reason", "not running as root (--container-runtime podman runs rootless podman)")
			return nil, nil
		}
		var perr, derr error
		if r, perr = podman(); perr != nil {
			r, derr = docker()
		}
		if r == nil {
			rt.Log.Info(noRuntime, "reason", errors.Join(perr, derr))
			return nil, nil
		}
	case runtimePodman:
		r, err = podman()
	case runtimeDocker:
		r, err = docker()
	default:
		return nil, fmt.Errorf("--container-runtime %q: want %s, %s, %s or %s", o.kind, runtimeAuto, runtimePodman, runtimeDocker, runtimeNone)
	}
	if err != nil {
		return nil, fmt.Errorf("--container-runtime %s: %w", o.kind, err)
	}
	rt.Log.Info("the pods' containers are run by " + r.Name())
	return r, nil
}

// cdiDirsOr is dirs, or CDI's default directories when there are none.
func cdiDirsOr(dirs []string) string {
	if len(dirs) == 0 {
		return "/etc/cdi, /var/run/cdi"
	}
	return strings.Join(dirs, ", ")
}

// podOptions are what the pod worker is given besides the API and the
// claims.
type podOptions struct {
	runtime containers.Runtime
	devices podworker.Devices
}

// dialDevices connects (lazily: the dramanager serves whether the
// devicemanager is up or not) to the devicemanager, for the pods'
// device-plugin resources and their containers' starts.
func (o runtimeOptions) dialDevices(rt *app.Runtime) (podworker.Devices, error) {
	addr := o.devicemanager
	if addr == "" {
		addr = layout.APISocket(rt.Config.RootDir, "devicemanager")
	}
	conn, err := rt.Config.DialPeer(addr)
	if err != nil {
		return nil, err
	}
	rt.Go(func(ctx context.Context) error { <-ctx.Done(); return conn.Close() })
	return podworker.NewDevices(conn, addr), nil
}
