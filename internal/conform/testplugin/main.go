package testplugin

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Main runs the plugin as a process until SIGTERM and returns its exit
// code. Flags: --mode registry (a socket in plugins_registry, the default)
// or kubelet (a socket in device-plugins, registered on kubelet.sock and
// again whenever kubelet.sock is re-created), --faults a,b,... The root dir
// is $NODEPLUG_ROOT_DIR.
func Main(args []string) int {
	fs := flag.NewFlagSet("testplugin", flag.ContinueOnError)
	mode := fs.String("mode", "registry", "registry or kubelet")
	faults := fs.String("faults", "", "comma-separated faults")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	root := os.Getenv("NODEPLUG_ROOT_DIR")
	if root == "" {
		fmt.Fprintln(os.Stderr, "testplugin: NODEPLUG_ROOT_DIR is not set")
		return 2
	}
	var opts Options
	for _, f := range strings.Split(*faults, ",") {
		if f != "" {
			opts.Faults = append(opts.Faults, Fault(f))
		}
	}
	dir := app.PluginsRegistryDir(root)
	if *mode == "kubelet" {
		dir = app.DevicePluginsDir(root)
	}
	opts.Socket = filepath.Join(dir, "conform-test.sock")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	p := New(opts)
	if err := p.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, "testplugin:", err)
		return 1
	}
	fmt.Fprintln(os.Stderr, "testplugin: serving on", opts.Socket, "faults", opts.Faults)
	kubeletSock := app.KubeletSocket(root)
	var kubeletID unixsock.Identity
	if *mode == "kubelet" {
		kubeletID, _, _ = unixsock.Stat(kubeletSock)
		if err := p.register(kubeletSock); err != nil {
			fmt.Fprintln(os.Stderr, "testplugin: register:", err)
		}
	}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-sigs:
			if p.Has(FaultIgnoreSIGTERM) {
				fmt.Fprintln(os.Stderr, "testplugin: ignoring SIGTERM")
				continue
			}
			if p.Has(FaultKeepSocket) {
				return 0
			}
			p.Stop()
			_ = os.Remove(opts.Socket)
			return 0
		case <-p.Stopped():
			fmt.Fprintln(os.Stderr, "panic: send on closed channel")
			return 2
		case <-tick.C:
			if p.Has(FaultExitOnSocketRemoval) && !unixsock.IsSocket(opts.Socket) {
				fmt.Fprintln(os.Stderr, "panic: socket removed")
				return 2
			}
			if *mode != "kubelet" || p.Has(FaultNoReregister) {
				continue
			}
			if id, _, err := unixsock.Stat(kubeletSock); err == nil && id != kubeletID {
				kubeletID = id
				if !unixsock.IsSocket(opts.Socket) {
					p.Stop()
					if err := p.Serve(); err != nil {
						fmt.Fprintln(os.Stderr, "testplugin:", err)
						return 1
					}
				}
				if err := p.register(kubeletSock); err != nil {
					fmt.Fprintln(os.Stderr, "testplugin: register again:", err)
				}
			}
		}
	}
}

// register calls Register on kubelet.sock, breaking the request as its
// faults say.
func (p *Plugin) register(kubeletSock string) error {
	conn, err := rpcutil.DialPlugin(kubeletSock)
	if err != nil {
		return err
	}
	defer conn.Close()
	req := &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(p.opts.Socket), ResourceName: Resource, Options: p.options(),
	}
	if p.Has(FaultRegisterVersion) {
		req.Version = "v1alpha1"
	}
	if p.Has(FaultRegisterResource) {
		req.ResourceName = "no-domain"
	}
	if p.Has(FaultRegisterEndpoint) {
		req.Endpoint = p.opts.Socket
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, req)
	return err
}
