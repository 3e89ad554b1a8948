// Package kubeletreg runs the kubelet's own plugin registration on a
// plugins_registry directory: the plugin manager of k8s.io/kubernetes
// (pkg/kubelet/pluginmanager: its fsnotify watcher, its reconciler and its
// operation executor) with the kubelet's own handlers, the DRA plugin
// manager (pkg/kubelet/cm/dra/plugin, NewDRAPluginManager) for DRA drivers
// and the device manager (pkg/kubelet/cm/devicemanager, NewManagerImpl) for
// device plugins. cmd/kubeletreg runs it as a process of its own, which
// nodeplug-bench's floor phase measures beside nodeplug
// (internal/bench/kubelet.go of the main module).
//
// What differs from a kubelet:
//
//   - the DRA plugin manager's API client is a fake clientset whose
//     ResourceSlice wipes succeed at once, and it has no health stream
//     handler (the kubelet's is its DRA manager, which only drivers that
//     advertise DRAResourceHealth reach);
//   - the device manager is not started: its registration server on
//     kubelet.sock (the deprecated registration path) does not serve, and
//     its checkpoint is not read back;
//   - the device manager's handler is the registration server NewManagerImpl
//     makes (the kubelet's GetWatcherHandler), made again by the same
//     exported constructor with the manager's client handler wrapped, so
//     that the first ListAndWatch answer of each resource is reported; both
//     handlers' DeRegisterPlugin are wrapped to report deregistrations.
//
// The device manager keeps its checkpoint in /var/lib/kubelet/device-plugins
// and no exported constructor takes another directory. So Run bind-mounts
// Options.KubeletRoot over /var/lib/kubelet, which needs root and a mount
// namespace of the process's own (unshare -m, or CLONE_NEWNS as
// nodeplug-bench starts it): the host's /var/lib/kubelet, maybe a real
// kubelet's, is neither read nor written.
//
// Run writes one line to its output for each of:
//
//	ready                    the plugin manager runs
//	devices <resource>       the device manager handled the first
//	                         ListAndWatch answer of a resource's plugin
//	deregistered <endpoint>  a handler's DeRegisterPlugin returned
package kubeletreg

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
	draplugin "k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/cache"
)

// Options say where Run works.
type Options struct {
	Dir         string // the plugins_registry directory watched (created when missing)
	KubeletRoot string // the directory that stands for /var/lib/kubelet
}

// wipingDelay is the kubelet's (pkg/kubelet/cm/dra, defaultWipingDelay):
// how long a DRA driver may be gone before its ResourceSlices are wiped.
const wipingDelay = 30 * time.Second

// Main is cmd/kubeletreg: it parses args, runs until SIGTERM or SIGINT and
// returns the exit code (2 for a usage error, 1 for a failure).
func Main(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kubeletreg", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o Options
	fs.StringVar(&o.Dir, "dir", "", "the plugins_registry directory to watch (created when missing)")
	fs.StringVar(&o.KubeletRoot, "kubelet-root", "", "a directory bind-mounted over /var/lib/kubelet, where the device manager keeps its checkpoint "+
		"(needs root and a mount namespace of its own: run it under unshare -m)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.Dir == "" || o.KubeletRoot == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "kubeletreg: -dir and -kubelet-root are required, and nothing else")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := Run(ctx, o, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "kubeletreg:", err)
		return 1
	}
	return 0
}

// Run makes /var/lib/kubelet o.KubeletRoot, runs the plugin manager on
// o.Dir with the kubelet's handlers until ctx ends, and writes its lines
// (see the package documentation) to out and its errors, and nothing
// else, to errs.
func Run(ctx context.Context, o Options, out, errs io.Writer) error {
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	root, err := filepath.Abs(o.KubeletRoot)
	if err != nil {
		return err
	}
	if err := privateKubeletDir(root); err != nil {
		return err
	}
	// The watcher would create it too, but not before "ready".
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	logger := errorsOnly(errs)
	klog.SetLogger(logger)
	ctx = klog.NewContext(ctx, logger)
	lines := &lineWriter{w: out}

	dp, err := deviceManager(logger, lines)
	if err != nil {
		return fmt.Errorf("device manager: %w", err)
	}
	dra := draPlugins(ctx)
	defer dra.Stop()

	pm := pluginmanager.NewPluginManager(dir, &record.FakeRecorder{})
	pm.AddHandler(registerapi.DevicePlugin, announced{dp, lines})
	pm.AddHandler(registerapi.DRAPlugin, announced{dra, lines})
	stop, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		pm.Run(ctx, sourcesReady{}, stop)
	}()
	// The watcher walks the directory once it watches it, so a socket
	// created from now on is registered, whether the watcher started
	// before it was created or after.
	lines.print("ready")
	select {
	case <-ctx.Done():
		close(stop)
		<-ended
		return lines.failure()
	case <-ended:
		return errors.New("the plugin manager stopped: its watcher did not start")
	}
}

// deviceManager returns the kubelet's device plugin handler: the device
// manager's registration server, as NewManagerImpl makes it, with the
// manager's client handler wrapped (firstUpdates).
func deviceManager(logger klog.Logger, lines *lineWriter) (cache.PluginHandler, error) {
	// No topology and no affinity store: they serve allocation, not
	// registration.
	m, err := devicemanager.NewManagerImpl(logger, nil, nil)
	if err != nil {
		return nil, err
	}
	return plugin.NewServer(logger, pluginapi.KubeletSocket, m, &firstUpdates{ManagerImpl: m, lines: lines, seen: map[string]bool{}})
}

// draPlugins returns the kubelet's DRA plugin manager, its API server a
// fake one that accepts the ResourceSlice wipes.
func draPlugins(ctx context.Context) *draplugin.DRAPluginManager {
	client := fake.NewClientset()
	client.PrependReactor("delete-collection", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, nil
	})
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "kubeletreg"}}
	getNode := func(context.Context) (*v1.Node, error) { return node, nil }
	return draplugin.NewDRAPluginManager(ctx, client, getNode, nil, wipingDelay)
}

// sourcesReady is the kubelet's pod sources, all seen.
type sourcesReady struct{}

func (sourcesReady) AddSource(string) {}
func (sourcesReady) AllReady() bool   { return true }

// announced is a plugin handler that reports each deregistration once its
// handler is done with it.
type announced struct {
	cache.PluginHandler
	lines *lineWriter
}

func (a announced) DeRegisterPlugin(ctx context.Context, name, endpoint string) {
	a.PluginHandler.DeRegisterPlugin(ctx, name, endpoint)
	a.lines.print("deregistered", endpoint)
}

// firstUpdates is the device manager's client handler, reporting the
// first ListAndWatch answer of each resource once the manager handled it
// (its device sets updated and its checkpoint written).
type firstUpdates struct {
	*devicemanager.ManagerImpl
	lines *lineWriter

	mu   sync.Mutex
	seen map[string]bool
}

func (f *firstUpdates) PluginListAndWatchReceiver(logger klog.Logger, resource string, resp *pluginapi.ListAndWatchResponse) {
	f.ManagerImpl.PluginListAndWatchReceiver(logger, resource, resp)
	f.mu.Lock()
	first := !f.seen[resource]
	f.seen[resource] = true
	f.mu.Unlock()
	if first {
		f.lines.print("devices", resource)
	}
}

func (f *firstUpdates) PluginDisconnected(logger klog.Logger, resource, socket string) {
	f.ManagerImpl.PluginDisconnected(logger, resource, socket)
	f.mu.Lock()
	delete(f.seen, resource)
	f.mu.Unlock()
}

// lineWriter writes whole lines from any goroutine and keeps the first
// failure.
type lineWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

func (l *lineWriter) print(words ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		_, l.err = fmt.Fprintln(l.w, strings.Join(words, " "))
	}
}

func (l *lineWriter) failure() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}
