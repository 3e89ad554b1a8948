// Command nodeplug-sampleplugin is an example device plugin: N fake devices
// of one extended resource, served on one socket with both the v1beta1
// DevicePlugin service and the pluginregistration Registration service.
//
// Modes:
//   - plugins-registry (default): the socket is created in
//     <root-dir>/plugins_registry, where the watcher finds it.
//   - kubelet-sock: the socket is created in <root-dir>/device-plugins and
//     the plugin calls v1beta1 Registration/Register on kubelet.sock there.
//     When kubelet.sock is created again (a restart of the devicemanager or
//     kubelet), it registers again, restarting its server first when its
//     socket was removed (the upstream sample plugin always restarts it).
//
// Device health can be flipped while it runs:
//   - SIGUSR1 marks the first healthy device unhealthy, SIGUSR2 marks the
//     first unhealthy device healthy;
//   - with --control-listen, an HTTP endpoint: GET /devices lists devices,
//     POST /health?device=<id>&healthy=<true|false> sets one device's health.
//
// Failures can be injected too: --prestart-error makes every
// PreStartContainer fail with its message, and the control endpoint's
// POST /failure?method=<DevicePlugin method>&message=<text> makes every
// later call of that method fail with the message (an empty one clears it).
//
// It runs until SIGINT or SIGTERM and removes its socket on exit.
//
// With --healthcheck (and the flags it runs with) it checks a running
// instance instead: its socket answers GetDevicePluginOptions, exit 0, or
// exit 1 (the compose stack's healthcheck; the image has no shell).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/version"
)

const (
	modeRegistry = "plugins-registry"
	modeKubelet  = "kubelet-sock"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Stderr, nil))
}

type config struct {
	*app.Common
	resource, mode, socketName, control string
	mountHostDir, prestartErr           string
	devices                             int
	preferred, prestart, cdi            bool
	healthcheck                         bool
}

// run runs the plugin until ctx ends and returns the exit code. ready, when
// set, receives the control address ("" without --control-listen) once the
// plugin serves.
func run(ctx context.Context, args []string, stderr io.Writer, ready func(p *sampleplugin.Plugin, control string)) int {
	var c config
	fs := app.NewFlags("sampleplugin")
	fs.SetOutput(stderr)
	c.Common = fs.AddCommon()
	fs.StringVar(&c.resource, "resource", "example.com/sample", "extended resource name")
	fs.IntVar(&c.devices, "devices", 4, "number of devices (IDs dev-0 .. dev-<N-1>)")
	fs.StringVar(&c.mode, "mode", modeRegistry, "registration path: plugins-registry or kubelet-sock")
	fs.StringVar(&c.socketName, "socket-name", "", "socket file name (default derived from the resource name)")
	fs.BoolVar(&c.preferred, "preferred", false, "offer GetPreferredAllocation (prefers the highest IDs)")
	fs.BoolVar(&c.prestart, "prestart", false, "require PreStartContainer calls")
	fs.BoolVar(&c.cdi, "cdi", false, "return CDI device names in Allocate responses")
	fs.StringVar(&c.mountHostDir, "mount-host-dir", sampleplugin.DefaultMountHostDir, "host directory the mounts of Allocate responses come from (<dir>/<device id>)")
	fs.StringVar(&c.prestartErr, "prestart-error", "", "make every PreStartContainer call fail with this message (the call is made only with --prestart); empty: they succeed")
	fs.StringVar(&c.control, "control-listen", "", "HTTP control address for health flips (GET /devices, POST /health?device=ID&healthy=BOOL); empty disables it")
	fs.BoolVar(&c.healthcheck, "healthcheck", false, "check the running plugin these flags describe (its socket answers GetDevicePluginOptions) and exit 0, or 1")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if c.ShowVersion {
		fmt.Printf("nodeplug-sampleplugin %s\n", version.Version)
		return 0
	}
	log, err := c.Logger(stderr)
	if err != nil {
		fmt.Fprintln(stderr, "nodeplug-sampleplugin:", err)
		return 2
	}
	if c.healthcheck {
		if err := healthcheck(ctx, c); err != nil {
			fmt.Fprintln(stderr, "nodeplug-sampleplugin: not healthy:", err)
			return 1
		}
		return 0
	}
	if err := serve(ctx, c, log, ready); err != nil {
		log.Error("exiting", "error", err)
		return 1
	}
	return 0
}

// socketPath is where the plugin's socket is, for its flags.
func socketPath(c config) (string, error) {
	if c.mode != modeRegistry && c.mode != modeKubelet {
		return "", fmt.Errorf("--mode %q: want %s or %s", c.mode, modeRegistry, modeKubelet)
	}
	root, err := filepath.Abs(c.RootDir)
	if err != nil {
		return "", err
	}
	dir := layout.PluginsRegistryDir(root)
	if c.mode == modeKubelet {
		dir = layout.DevicePluginsDir(root)
	}
	name := c.socketName
	if name == "" {
		name = strings.NewReplacer("/", "_", ".", "-").Replace(c.resource) + ".sock"
	}
	if strings.Contains(name, "/") {
		return "", fmt.Errorf("--socket-name %q must be a file name", name)
	}
	return filepath.Join(dir, name), nil
}

// healthcheck asks the plugin on its socket for its options, within 3 s.
func healthcheck(ctx context.Context, c config) error {
	path, err := socketPath(c)
	if err != nil {
		return err
	}
	conn, err := rpcutil.DialPlugin(path)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := pluginapi.NewDevicePluginClient(conn).GetDevicePluginOptions(ctx, &pluginapi.Empty{}); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// serve runs the plugin its flags describe until ctx ends: it serves the
// plugin's socket and the control endpoint, flips device health on
// SIGUSR1 and SIGUSR2, and in kubelet-sock mode registers on kubelet.sock
// each time it is created.
func serve(ctx context.Context, c config, log *slog.Logger, ready func(*sampleplugin.Plugin, string)) error {
	p, root, err := newPlugin(c, log)
	if err != nil {
		return err
	}
	dir := filepath.Dir(p.SocketPath())
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	var watcher *fsnotify.Watcher
	if c.mode == modeKubelet {
		// Watch before starting, so a kubelet.sock created meanwhile is seen.
		if watcher, err = watchDir(dir); err != nil {
			return err
		}
		defer watcher.Close()
	}
	if err := p.Start(); err != nil {
		return err
	}
	defer p.Stop()
	controlAddr, stopControl, err := startControl(c.control, p, log)
	if err != nil {
		return err
	}
	defer stopControl()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)

	s := &server{p: p, log: log, kubeletSock: layout.KubeletSocket(root)}
	if c.mode == modeKubelet {
		s.register(ctx)
	}
	if ready != nil {
		ready(p, controlAddr)
	}
	return s.loop(ctx, sigs, watcher)
}

// newPlugin makes the plugin its flags describe, not yet started, with the
// absolute root directory.
func newPlugin(c config, log *slog.Logger) (*sampleplugin.Plugin, string, error) {
	path, err := socketPath(c)
	if err != nil {
		return nil, "", err
	}
	root, err := filepath.Abs(c.RootDir)
	if err != nil {
		return nil, "", err
	}
	p, err := sampleplugin.New(sampleplugin.Options{
		Resource: c.resource, Devices: c.devices, SocketPath: path,
		Preferred: c.preferred, PreStartRequired: c.prestart, CDI: c.cdi, MountHostDir: c.mountHostDir, Log: log,
	})
	if err != nil {
		return nil, "", err
	}
	if c.prestartErr != "" {
		p.SetFailure(sampleplugin.MethodPreStartContainer, injected(c.prestartErr))
	}
	return p, root, nil
}

// watchDir watches dir, where kubelet.sock is created.
func watchDir(dir string) (*fsnotify.Watcher, error) {
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := watcher.Add(dir); err != nil {
		_ = watcher.Close()
		return nil, fmt.Errorf("watch %s: %w", dir, err)
	}
	return watcher, nil
}

// startControl serves the control endpoint on addr, unless it is empty.
// It returns the address it listens on ("" without one) and the function
// that closes it.
func startControl(addr string, p *sampleplugin.Plugin, log *slog.Logger) (string, func(), error) {
	if addr == "" {
		return "", func() {}, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("control listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: controlHandler(p), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(lis) }()
	controlAddr := lis.Addr().String()
	log.Info("control endpoint listening", "addr", controlAddr)
	return controlAddr, func() { _ = srv.Close() }, nil
}

// server is a started plugin and the state of its event loop; it is used
// by one goroutine.
type server struct {
	p           *sampleplugin.Plugin
	log         *slog.Logger
	kubeletSock string
	registerc   <-chan error // the outcome of the registration under way; nil: none
}

// register starts a registration on kubelet.sock; its outcome comes on
// registerc.
func (s *server) register(ctx context.Context) {
	errc := make(chan error, 1)
	s.registerc = errc
	go func() { errc <- registerWithRetry(ctx, s.p, s.kubeletSock, s.log) }()
}

// loop handles health-flip signals, registration outcomes and the events
// of watcher (nil: none) until ctx ends.
func (s *server) loop(ctx context.Context, sigs <-chan os.Signal, watcher *fsnotify.Watcher) error {
	var events <-chan fsnotify.Event
	var werrs <-chan error
	if watcher != nil {
		events, werrs = watcher.Events, watcher.Errors
	}
	for {
		select {
		case <-ctx.Done():
			s.log.Info("stopping", "socket", s.p.SocketPath())
			return nil
		case sig := <-sigs:
			flip(s.p, sig == syscall.SIGUSR2, s.log)
		case err := <-s.registerc:
			s.registerc = nil
			if err != nil {
				s.log.Warn("registration on kubelet.sock failed; waiting for kubelet.sock to be created again", "error", err)
			}
		case ev := <-events:
			if ev.Name == s.kubeletSock && ev.Has(fsnotify.Create) {
				if err := s.kubeletSockCreated(ctx); err != nil {
					return err
				}
			}
		case err := <-werrs:
			s.log.Warn("watching the device-plugins directory", "error", err)
		}
	}
}

// kubeletSockCreated registers again, restarting the server first if its
// socket is gone: a restarted kubelet removes the plugins' sockets; a
// restarted devicemanager keeps those it could redial.
func (s *server) kubeletSockCreated(ctx context.Context) error {
	if _, err := os.Stat(s.p.SocketPath()); err != nil {
		s.log.Info("kubelet.sock created and our socket is gone: restarting the server")
		s.p.Stop()
		if err := s.p.Start(); err != nil {
			return err
		}
	}
	s.log.Info("kubelet.sock created: registering again")
	s.register(ctx)
	return nil
}

// registerWithRetry registers on kubelet.sock, retrying briefly: kubelet.sock
// may exist before it accepts connections.
func registerWithRetry(ctx context.Context, p *sampleplugin.Plugin, kubeletSock string, log *slog.Logger) error {
	var err error
	for delay := 50 * time.Millisecond; delay < 5*time.Second; delay *= 2 {
		if _, serr := os.Stat(kubeletSock); serr == nil {
			if err = p.Register(ctx, kubeletSock); err == nil {
				log.Info("registered on kubelet.sock", "resource", p.Resource(), "socket", p.SocketPath())
				return nil
			}
		} else {
			err = serr
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
	return err
}

// flip marks the first healthy device unhealthy, or (toHealthy) the first
// unhealthy device healthy.
func flip(p *sampleplugin.Plugin, toHealthy bool, log *slog.Logger) {
	for _, d := range p.Devices() {
		if (d.Health == pluginapi.Healthy) != toHealthy {
			if err := p.SetHealth(d.ID, toHealthy); err == nil {
				log.Info("device health set", "device", d.ID, "healthy", toHealthy)
			}
			return
		}
	}
	log.Info("no device to flip", "to_healthy", toHealthy)
}

func controlHandler(p *sampleplugin.Plugin) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /devices", func(w http.ResponseWriter, _ *http.Request) {
		type dev struct {
			ID     string `json:"id"`
			Health string `json:"health"`
		}
		var out []dev
		for _, d := range p.Devices() {
			out = append(out, dev{d.ID, d.Health})
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
	mux.HandleFunc("POST /health", func(w http.ResponseWriter, r *http.Request) {
		healthy, err := strconv.ParseBool(r.URL.Query().Get("healthy"))
		if err != nil {
			http.Error(w, "healthy must be true or false", http.StatusBadRequest)
			return
		}
		if err := p.SetHealth(r.URL.Query().Get("device"), healthy); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /failure", func(w http.ResponseWriter, r *http.Request) {
		method := r.URL.Query().Get("method")
		if !slices.Contains(failMethods, method) {
			http.Error(w, "method must be one of "+strings.Join(failMethods, ", "), http.StatusBadRequest)
			return
		}
		var err error
		if msg := r.URL.Query().Get("message"); msg != "" {
			err = injected(msg)
		}
		p.SetFailure(method, err)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// failMethods are the DevicePlugin methods POST /failure takes.
var failMethods = []string{
	sampleplugin.MethodGetDevicePluginOptions, sampleplugin.MethodListAndWatch, sampleplugin.MethodGetPreferredAllocation,
	sampleplugin.MethodAllocate, sampleplugin.MethodPreStartContainer,
}

// injected is the error an injected failure answers: code INTERNAL with
// the message given.
func injected(msg string) error { return status.Error(codes.Internal, msg) }
