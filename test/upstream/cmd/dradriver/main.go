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
//   - --counters-file FILE: a JSON array of resource.k8s.io/v1 CounterSets
//     (the shared counters of partitionable devices) to publish in a slice
//     of their own in the pool, beside the devices' slice (the API takes a
//     slice's devices or its counters, not both); read again on SIGHUP too;
//   - --device-metadata: the helper's device metadata (KEP 5304): each
//     prepared request's devices are written to a metadata file that a
//     further CDI device of the driver mounts into the containers, under
//     /var/run/kubernetes.io/dra-device-attributes;
//   - --rolling-update UID: the helper's rolling-update mode (its own
//     registration and DRA sockets, so that two instances run at once);
//   - --state-file FILE: on SIGUSR1 the driver first reads --control-file
//     (when given) and then writes FILE (atomically, by rename) with what
//     the upstream app recorded: every gRPC call it served (method,
//     request and error), the claims it holds prepared, its failure modes
//     and a sequence number that grows with each write, so that a test
//     that signals knows when the answer is fresh;
//   - --control-file FILE: its lines set the upstream app's failure modes
//     ("fail-prepare", "fail-unprepare": NodePrepareResources or
//     NodeUnprepareResources fails as a whole with the app's simulated
//     error); a mode not named, or a file missing, is off.
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
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
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

// run starts the driver as the command line says and serves until SIGTERM
// or SIGINT.
func run() error {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}

	logger, err := newLogger(o.logFormat)
	if err != nil {
		return err
	}
	klog.SetLogger(logger)
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	defer cancel()

	plugin, err := o.start(ctx, logger)
	if err != nil {
		return err
	}
	defer plugin.Stop()
	o.serve(ctx, plugin, logger)
	return nil
}

// options is the command line.
type options struct {
	driverName, nodeName, kubeconfig  string
	registryDir, dataDir, cdiDir      string
	numDevices                        int
	devicesFile, rollingUID           string
	countersFile                      string
	deviceMetadata                    bool
	logFormat, stateFile, controlFile string
}

// parseFlags parses args, the arguments after the command's name.
func parseFlags(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("dradriver", flag.ContinueOnError)
	fs.StringVar(&o.driverName, "drivername", "test-driver.cdi.k8s.io", "resource driver name")
	fs.StringVar(&o.nodeName, "node-name", "", "name of the node that the kubelet plugin is responsible for")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (KUBECONFIG, when set, wins, as in the upstream driver)")
	fs.StringVar(&o.registryDir, "plugin-registration-path", kubeletplugin.KubeletRegistryDir, "directory where the kubelet looks for plugin registration sockets")
	fs.StringVar(&o.dataDir, "datadir", kubeletplugin.KubeletPluginsDir, "directory holding the per-driver directory of the DRA socket")
	fs.StringVar(&o.cdiDir, "cdi-dir", "/var/run/cdi", "directory for the CDI files of prepared claims")
	fs.IntVar(&o.numDevices, "num-devices", 4, "number of devices to publish when --devices-file is not given")
	fs.StringVar(&o.devicesFile, "devices-file", "", "JSON array of resource.k8s.io/v1 Devices to publish, read again on SIGHUP")
	fs.StringVar(&o.countersFile, "counters-file", "", "JSON array of resource.k8s.io/v1 CounterSets to publish in a slice of their own, read again on SIGHUP")
	fs.BoolVar(&o.deviceMetadata, "device-metadata", false, "write device metadata files and mount them into the containers through CDI")
	fs.StringVar(&o.rollingUID, "rolling-update", "", "enable the helper's rolling-update mode with this pod UID")
	fs.StringVar(&o.logFormat, "log-format", "text", "text or json (slog's JSON on stderr)")
	fs.StringVar(&o.stateFile, "state-file", "", "file written on SIGUSR1 with the gRPC calls served and the claims prepared")
	fs.StringVar(&o.controlFile, "control-file", "", "file read on SIGUSR1 for the failure modes (fail-prepare, fail-unprepare)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	return o, nil
}

// clientset is the API server's client, from KUBECONFIG or --kubeconfig.
func (o *options) clientset() (*kubernetes.Clientset, error) {
	if o.nodeName == "" {
		return nil, errors.New("--node-name not set")
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		o.kubeconfig = env
	}
	if o.kubeconfig == "" {
		return nil, errors.New("no kubeconfig: set KUBECONFIG or --kubeconfig")
	}
	config, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", o.kubeconfig, err)
	}
	clientset, err := kubernetes.NewForConfig(config)
	if err != nil {
		return nil, fmt.Errorf("create client: %w", err)
	}
	return clientset, nil
}

// start makes the CDI and socket directories and starts the upstream
// app's plugin, publishing the devices; the caller stops it.
func (o *options) start(ctx context.Context, logger logr.Logger) (*app.ExamplePlugin, error) {
	clientset, err := o.clientset()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.cdiDir, 0o750); err != nil {
		return nil, fmt.Errorf("create CDI directory: %w", err)
	}
	datadir := filepath.Join(o.dataDir, o.driverName)
	if err := os.MkdirAll(datadir, 0o750); err != nil {
		return nil, fmt.Errorf("create socket directory: %w", err)
	}

	resources, err := driverResources(o.nodeName, o.devicesFile, o.countersFile, o.numDevices)
	if err != nil {
		return nil, err
	}
	opts := []any{
		app.Options{EnableHealthService: true},
		kubeletplugin.PluginDataDirectoryPath(datadir),
		kubeletplugin.RegistrarDirectoryPath(o.registryDir),
	}
	if o.rollingUID != "" {
		opts = append(opts, kubeletplugin.RollingUpdate(types.UID(o.rollingUID)))
	}
	if o.deviceMetadata {
		opts = append(opts,
			kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}),
			kubeletplugin.CDIDirectory(o.cdiDir))
	}
	plugin, err := app.StartPlugin(ctx, o.cdiDir, o.driverName, clientset, o.nodeName, app.FileOperations{DriverResources: &resources}, opts...)
	if err != nil {
		return nil, fmt.Errorf("start the plugin: %w", err)
	}
	logger.Info("driver started", "driver", o.driverName, "node", o.nodeName, "devices", len(resources.Pools[o.nodeName].Slices[0].Devices))
	return plugin, nil
}

// serve answers signals until SIGTERM or SIGINT: SIGUSR1 writes the state
// file, SIGHUP publishes the devices file's devices again.
func (o *options) serve(ctx context.Context, plugin *app.ExamplePlugin, logger logr.Logger) {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1)
	st := &stateWriter{plugin: plugin, state: o.stateFile, control: o.controlFile}
	for sig := range sigc {
		if sig == syscall.SIGUSR1 {
			if err := st.update(); err != nil {
				logger.Error(err, "state not written")
			}
			continue
		}
		if sig != syscall.SIGHUP {
			logger.Info("stopping", "signal", sig.String())
			return
		}
		// A file that cannot be read or parsed leaves the published
		// devices as they are.
		resources, err := driverResources(o.nodeName, o.devicesFile, o.countersFile, o.numDevices)
		if err != nil {
			logger.Error(err, "devices not republished")
			continue
		}
		if err := plugin.PublishResources(ctx, resources); err != nil {
			logger.Error(err, "devices not republished")
			continue
		}
		logger.Info("devices republished", "devices", len(resources.Pools[o.nodeName].Slices[0].Devices))
	}
}

// driverResources is one pool named after the node with one slice: the
// devices of file, or n devices named device-00, device-01, … as the
// upstream driver publishes; and a second slice with the counter sets of
// countersFile when it is given.
func driverResources(node, file, countersFile string, n int) (resourceslice.DriverResources, error) {
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
	slices := []resourceslice.Slice{{Devices: devices}}
	if countersFile != "" {
		data, err := os.ReadFile(countersFile)
		if err != nil {
			return resourceslice.DriverResources{}, fmt.Errorf("read the counters file: %w", err)
		}
		var counters []resourceapi.CounterSet
		if err := json.Unmarshal(data, &counters); err != nil {
			return resourceslice.DriverResources{}, fmt.Errorf("parse the counters file %s: %w", countersFile, err)
		}
		slices = append(slices, resourceslice.Slice{SharedCounters: counters})
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{node: {Slices: slices}},
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

// stateWriter answers SIGUSR1: failure modes from the control file, the
// app's record to the state file.
type stateWriter struct {
	plugin         *app.ExamplePlugin
	state, control string
	seq            int
	// unset undo the failure modes set now, by name.
	unset map[string]func()
}

// State is the state file's content.
type State struct {
	Seq           int        `json:"seq"`
	FailPrepare   bool       `json:"failPrepare"`
	FailUnprepare bool       `json:"failUnprepare"`
	Calls         []Call     `json:"calls"`
	Prepared      []Prepared `json:"prepared"`
}

// Call is one gRPC call the driver served, the request as its JSON.
type Call struct {
	Method  string          `json:"method"`
	Request json.RawMessage `json:"request,omitempty"`
	Err     string          `json:"error,omitempty"`
	Done    bool            `json:"done"`
}

// Prepared is a claim the driver holds prepared.
type Prepared struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

func (w *stateWriter) update() error {
	if w.unset == nil {
		w.unset = map[string]func(){}
	}
	want := map[string]bool{}
	if w.control != "" {
		data, err := os.ReadFile(w.control)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("read the control file: %w", err)
		}
		for _, line := range strings.Fields(string(data)) {
			if line != "fail-prepare" && line != "fail-unprepare" {
				return fmt.Errorf("control file %s: unknown mode %q (want fail-prepare or fail-unprepare)", w.control, line)
			}
			want[line] = true
		}
	}
	for mode, set := range map[string]func() func(){
		"fail-prepare":   w.plugin.SetNodePrepareResourcesFailureMode,
		"fail-unprepare": w.plugin.SetNodeUnprepareResourcesFailureMode,
	} {
		switch undo, on := w.unset[mode]; {
		case want[mode] && !on:
			w.unset[mode] = set()
		case !want[mode] && on:
			undo()
			delete(w.unset, mode)
		}
	}
	if w.state == "" {
		return nil
	}
	w.seq++
	st := State{Seq: w.seq, FailPrepare: w.unset["fail-prepare"] != nil, FailUnprepare: w.unset["fail-unprepare"] != nil}
	for _, c := range w.plugin.GetGRPCCalls() {
		call := Call{Method: c.FullMethod, Done: c.Response != nil || c.Err != nil}
		if c.Request != nil {
			if data, err := json.Marshal(c.Request); err == nil {
				call.Request = data
			}
		}
		if c.Err != nil {
			call.Err = c.Err.Error()
		}
		st.Calls = append(st.Calls, call)
	}
	for _, p := range w.plugin.GetPreparedResources() {
		st.Prepared = append(st.Prepared, Prepared{Name: p.Name, UID: string(p.UID)})
	}
	data, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode the state: %w", err)
	}
	tmp := w.state + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write the state file: %w", err)
	}
	if err := os.Rename(tmp, w.state); err != nil {
		return fmt.Errorf("write the state file: %w", err)
	}
	return nil
}
