// Command dradriver is the upstream DRA test driver
// (k8s.io/kubernetes/test/e2e/dra/test-driver/app, built on the
// k8s.io/dynamic-resource-allocation/kubeletplugin helper) as a process of
// its own, with one addition the end-to-end tests need: its devices can
// change while it runs. It takes the upstream kubelet-plugin flags
// (--node-name, --datadir, --plugin-registration-path, --cdi-dir,
// --num-devices, --kubeconfig or KUBECONFIG, --drivername) and
//
//   - --devices-file FILE: a JSON array of resource.k8s.io/v1 Devices to
//     publish instead of --num-devices devices; on SIGHUP the file is read
//     again and its devices are published in place of the old ones;
//   - --rolling-update UID: the helper's rolling-update mode (its own
//     registration and DRA sockets, so that two instances run at once).
//
// Like the upstream driver it publishes one pool named after the node, and
// on SIGTERM or SIGINT it stops the helper, which removes its sockets.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/test/e2e/dra/test-driver/app"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dradriver:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("dradriver", flag.ContinueOnError)
	driverName := fs.String("drivername", "test-driver.cdi.k8s.io", "resource driver name")
	nodeName := fs.String("node-name", "", "name of the node that the kubelet plugin is responsible for")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the API server (KUBECONFIG, when set, wins, as in the upstream driver)")
	registryDir := fs.String("plugin-registration-path", kubeletplugin.KubeletRegistryDir, "directory where the kubelet looks for plugin registration sockets")
	dataDir := fs.String("datadir", kubeletplugin.KubeletPluginsDir, "directory holding the per-driver directory of the DRA socket")
	cdiDir := fs.String("cdi-dir", "/var/run/cdi", "directory for the CDI files of prepared claims")
	numDevices := fs.Int("num-devices", 4, "number of devices to publish when --devices-file is not given")
	devicesFile := fs.String("devices-file", "", "JSON array of resource.k8s.io/v1 Devices to publish, read again on SIGHUP")
	rollingUID := fs.String("rolling-update", "", "enable the helper's rolling-update mode with this pod UID")
	logFormat := fs.String("log-format", "text", "text or json (slog's JSON on stderr)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}

	logger, err := newLogger(*logFormat)
	if err != nil {
		return err
	}
	klog.SetLogger(logger)
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()

	if *nodeName == "" {
		return errors.New("--node-name not set")
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		*kubeconfig = env
	}
	if *kubeconfig == "" {
		return errors.New("no kubeconfig: set KUBECONFIG or --kubeconfig")
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig %s: %w", *kubeconfig, err)
	}
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fmt.Errorf("create client: %w", err)
	}

	if err := os.MkdirAll(*cdiDir, 0o750); err != nil {
		return fmt.Errorf("create CDI directory: %w", err)
	}
	datadir := filepath.Join(*dataDir, *driverName)
	if err := os.MkdirAll(datadir, 0o750); err != nil {
		return fmt.Errorf("create socket directory: %w", err)
	}

	resources, err := driverResources(*nodeName, *devicesFile, *numDevices)
	if err != nil {
		return err
	}
	opts := []any{
		app.Options{EnableHealthService: true},
		kubeletplugin.PluginDataDirectoryPath(datadir),
		kubeletplugin.RegistrarDirectoryPath(*registryDir),
	}
	if *rollingUID != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(*rollingUID)))
	}
	plugin, err := app.StartPlugin(ctx, *cdiDir, *driverName, clientset, *nodeName, app.FileOperations{DriverResources: &resources}, opts...)
	if err != nil {
		return fmt.Errorf("start the plugin: %w", err)
	}
	defer plugin.Stop()
	logger.Info("driver started", "driver", *driverName, "node", *nodeName, "devices", len(resources.Pools[*nodeName].Slices[0].Devices))

	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	for sig := range sigc {
		if sig != syscall.SIGHUP {
			logger.Info("stopping", "signal", sig.String())
			return nil
		}
		// A file that cannot be read or parsed leaves the published
		// devices as they are.
		resources, err := driverResources(*nodeName, *devicesFile, *numDevices)
		if err != nil {
			logger.Error(err, "devices not republished")
			continue
		}
		if err := plugin.PublishResources(ctx, resources); err != nil {
			logger.Error(err, "devices not republished")
			continue
		}
		logger.Info("devices republished", "devices", len(resources.Pools[*nodeName].Slices[0].Devices))
	}
	return nil
}

// driverResources is one pool named after the node with one slice: the
// devices of file, or n devices named device-00, device-01, … as the
// upstream driver publishes.
func driverResources(node, file string, n int) (resourceslice.DriverResources, error) {
	var devices []resourceapi.Device
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return resourceslice.DriverResources{}, fmt.Errorf("read the devices file: %w", err)
		}
		if err := json.Unmarshal(data, &devices); err != nil {
			return resourceslice.DriverResources{}, fmt.Errorf("parse the devices file %s: %w", file, err)
		}
	} else {
		for i := range n {
			devices = append(devices, resourceapi.Device{Name: fmt.Sprintf("device-%02d", i)})
		}
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{
			node: {Slices: []resourceslice.Slice{{Devices: devices}}},
		},
	}, nil
}

func newLogger(format string) (logr.Logger, error) {
	switch format {
	case "text":
		return logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})), nil
	case "json":
		return logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})), nil
	}
	return logr.Logger{}, fmt.Errorf("--log-format %q: want text or json", format)
}
