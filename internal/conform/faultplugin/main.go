package faultplugin

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Main runs the plugin as a process until SIGTERM and returns its exit
// code. Flags: --mode registry (a socket in plugins_registry, the default)
// or kubelet (a socket in device-plugins, registered on kubelet.sock and
// again whenever kubelet.sock is re-created), --faults a,b,...,
// --resources N (N resources, each with its own socket: Resource, then
// Resource with 2, 3, ... appended; --fault-resource K gives the faults to
// the K-th only), --empty-first (Options.EmptyFirst) and
// --recreate-after D (a socket found removed is created again D later, and
// registered again in kubelet mode). The root dir is $NODEPLUG_ROOT_DIR.
func Main(args []string) int {
	fs := flag.NewFlagSet("faultplugin", flag.ContinueOnError)
	mode := fs.String("mode", "registry", "registry or kubelet")
	faults := fs.String("faults", "", "comma-separated faults")
	resources := fs.Int("resources", 1, "how many resources to serve, each on its own socket")
	emptyFirst := fs.Bool("empty-first", false, "send an empty device list first on every stream")
	recreate := fs.Duration("recreate-after", 0, "create a removed socket again after this long (0: never)")
	faultResource := fs.Int("fault-resource", 0, "give the faults only to this resource (1, 2, ...; 0: to all)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	root := os.Getenv("NODEPLUG_ROOT_DIR")
	if root == "" {
		fmt.Fprintln(os.Stderr, "faultplugin: NODEPLUG_ROOT_DIR is not set")
		return 2
	}
	var faultList []Fault
	for _, f := range strings.Split(*faults, ",") {
		if f != "" {
			faultList = append(faultList, Fault(f))
		}
	}
	dir := layout.PluginsRegistryDir(root)
	if *mode == "kubelet" {
		dir = layout.DevicePluginsDir(root)
	}
	var ps []*procPlugin
	for i := range max(*resources, 1) {
		opts := Options{EmptyFirst: *emptyFirst, Resource: Resource, Socket: filepath.Join(dir, "conform-test.sock")}
		if *faultResource == 0 || *faultResource == i+1 {
			opts.Faults = faultList
		}
		if i > 0 {
			opts.Resource = fmt.Sprintf("%s%d", Resource, i+1)
			opts.Socket = filepath.Join(dir, fmt.Sprintf("conform-test-%d.sock", i+1))
		}
		ps = append(ps, &procPlugin{Plugin: New(opts)})
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM)
	kubeletSock := layout.KubeletSocket(root)
	kubeletID, _, _ := unixsock.Stat(kubeletSock)
	for _, p := range ps {
		if err := p.Serve(); err != nil {
			fmt.Fprintln(os.Stderr, "faultplugin:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "faultplugin: serving", p.resource(), "on", p.opts.Socket, "faults", p.opts.Faults)
		if *mode == "kubelet" {
			if err := p.register(kubeletSock); err != nil {
				fmt.Fprintln(os.Stderr, "faultplugin: register:", err)
			}
		}
	}
	stopped := stoppedAny(ps)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-sigs:
			if ps[0].Has(FaultIgnoreSIGTERM) {
				fmt.Fprintln(os.Stderr, "faultplugin: ignoring SIGTERM")
				continue
			}
			if ps[0].Has(FaultKeepSocket) {
				return 0
			}
			for _, p := range ps {
				p.Stop()
				_ = os.Remove(p.opts.Socket)
			}
			return 0
		case <-stopped:
			fmt.Fprintln(os.Stderr, "panic: send on closed channel")
			return 2
		case <-tick.C:
			kubeletNew := false
			if id, _, err := unixsock.Stat(kubeletSock); err == nil && id != kubeletID {
				kubeletID, kubeletNew = id, true
			}
			for _, p := range ps {
				if code, exit := p.tick(*mode == "kubelet", kubeletSock, kubeletNew, *recreate); exit {
					return code
				}
			}
		}
	}
}

// procPlugin is one resource of the plugin as a process.
type procPlugin struct {
	*Plugin
	missingSince time.Time // when its socket was first seen removed
}

// tick looks at the plugin's socket and kubelet.sock: a removed socket is
// a crash (FaultExitOnSocketRemoval) or created again after recreate; a
// re-created kubelet.sock is registered with again (kubelet mode).
func (p *procPlugin) tick(kubelet bool, kubeletSock string, kubeletNew bool, recreate time.Duration) (int, bool) {
	present := unixsock.IsSocket(p.opts.Socket)
	if p.Has(FaultExitOnSocketRemoval) && !present {
		fmt.Fprintln(os.Stderr, "panic: socket removed")
		return 2, true
	}
	if present {
		p.missingSince = time.Time{}
	} else if p.missingSince.IsZero() {
		p.missingSince = time.Now()
	}
	again := false
	if !present && recreate > 0 && time.Since(p.missingSince) >= recreate {
		fmt.Fprintln(os.Stderr, "faultplugin: creating", p.opts.Socket, "again")
		again = true
	}
	if kubelet && kubeletNew && !p.Has(FaultNoReregister) {
		again = again || !present
		if !again {
			if err := p.register(kubeletSock); err != nil {
				fmt.Fprintln(os.Stderr, "faultplugin: register again:", err)
			}
			return 0, false
		}
	}
	if !again {
		return 0, false
	}
	p.Stop()
	if err := p.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, "faultplugin:", err)
		return 1, true
	}
	p.missingSince = time.Time{}
	if kubelet && !p.Has(FaultNoReregister) {
		if err := p.register(kubeletSock); err != nil {
			fmt.Fprintln(os.Stderr, "faultplugin: register again:", err)
		}
	}
	return 0, false
}

// stoppedAny returns a channel closed when any of ps stopped itself.
func stoppedAny(ps []*procPlugin) <-chan struct{} {
	if len(ps) == 1 {
		return ps[0].Stopped()
	}
	out := make(chan struct{})
	var once sync.Once
	for _, p := range ps {
		go func() {
			<-p.Stopped()
			once.Do(func() { close(out) })
		}()
	}
	return out
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
		Version: pluginapi.Version, Endpoint: filepath.Base(p.opts.Socket), ResourceName: p.resource(), Options: p.options(),
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
