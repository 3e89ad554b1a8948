// Package sampleplugin is a device plugin built on the upstream
// k8s.io/kubelet v1beta1 API: N fake devices of one extended resource, served
// on one Unix socket together with the pluginregistration v1 Registration
// service, so it can be registered through plugins_registry or by calling
// v1beta1 Registration/Register on a kubelet.sock.
//
// It is the core of nodeplug-sampleplugin and the plugin that tests, the
// benchmark and the local stack use. Health flips, stream endings and errors
// can be injected, and every DevicePlugin call is logged. The registration
// service is pkg/testplugin's Registration, embedded: its knobs and its
// record of NotifyRegistrationStatus are the Plugin's.
package sampleplugin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Method names of the v1beta1.DevicePlugin calls, used in the call log and
// for error injection.
const (
	MethodGetDevicePluginOptions = "GetDevicePluginOptions"
	MethodListAndWatch           = "ListAndWatch"
	MethodGetPreferredAllocation = "GetPreferredAllocation"
	MethodAllocate               = "Allocate"
	MethodPreStartContainer      = "PreStartContainer"
)

// Options configure a Plugin.
type Options struct {
	// Resource is the extended resource name, e.g. example.com/sample.
	Resource string
	// SocketPath is the absolute path the plugin listens on.
	SocketPath string
	// Endpoint is the endpoint GetInfo reports; empty means SocketPath. Set
	// it when the socket is moved into place after it listens.
	Endpoint string
	// DeviceIDs are the device IDs. When empty, Devices IDs "dev-0" ..
	// "dev-<Devices-1>" are used.
	DeviceIDs []string
	Devices   int
	// Preferred offers GetPreferredAllocation. The preference is the highest
	// available IDs in sorted order (after the must-include ones), so callers
	// can tell it was used.
	Preferred bool
	// PreStartRequired asks for PreStartContainer calls.
	PreStartRequired bool
	// CDI adds CDI device names "<vendor>/<class>=<id>" (the resource name
	// with '/' as vendor/class) to Allocate responses.
	CDI bool
	// AllocateResponse, when set, builds the response for one container's
	// device IDs. The default returns an env NODEPLUG_DEVICES, a mount, a
	// device spec per device and an annotation.
	AllocateResponse func(ids []string) *pluginapi.ContainerAllocateResponse
	// MountHostDir is the host directory the default response's mounts
	// come from: device id is mounted from <MountHostDir>/<id> on
	// /dev/nodeplug/<id>, read-only. Empty means DefaultMountHostDir.
	MountHostDir string
	// NUMANodes gives devices a topology: the NUMA nodes of each device ID
	// listed. Devices not listed report none; a device listed with an
	// empty, non-nil slice reports a topology without nodes.
	NUMANodes map[string][]int64
	// Log receives the plugin's own log lines; nil discards them.
	Log *slog.Logger
}

// DefaultMountHostDir is where the default Allocate response's mounts come
// from when Options.MountHostDir is empty.
const DefaultMountHostDir = "/tmp"

// Call is one entry of the call log.
type Call struct {
	Method string
	// DeviceIDs of Allocate, PreStartContainer, or the available IDs of
	// GetPreferredAllocation.
	DeviceIDs []string
	// MustInclude and Size of GetPreferredAllocation.
	MustInclude []string
	Size        int32
}

// Plugin is a fake device plugin. It is safe for concurrent use.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	// Registration serves pluginregistration.Registration: GetInfo answers
	// the resource name as a DevicePlugin at Options.Endpoint (or the
	// socket), and every NotifyRegistrationStatus is recorded.
	*testplugin.Registration

	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	devices  []*pluginapi.Device // sorted by ID
	streams  map[chan struct{}]chan error
	failures map[string]error
	calls    []Call
	changed  chan struct{} // closed and replaced on every change
	prefer   []string      // fixed GetPreferredAllocation answer, if set

	server   *grpc.Server
	listener net.Listener
	served   chan struct{}
}

// New returns a plugin that is not yet serving.
func New(opts Options) (*Plugin, error) {
	if opts.Resource == "" {
		return nil, errors.New("sampleplugin: resource name is empty")
	}
	if !filepath.IsAbs(opts.SocketPath) {
		return nil, fmt.Errorf("sampleplugin: socket path %q is not absolute", opts.SocketPath)
	}
	ids := slices.Clone(opts.DeviceIDs)
	if len(ids) == 0 {
		for i := range opts.Devices {
			ids = append(ids, fmt.Sprintf("dev-%d", i))
		}
	}
	slices.Sort(ids)
	p := &Plugin{
		opts:     opts,
		log:      opts.Log,
		streams:  map[chan struct{}]chan error{},
		failures: map[string]error{},
		changed:  make(chan struct{}),
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.Registration = testplugin.NewRegistration(testplugin.Info{
		Type:     registerapi.DevicePlugin,
		Name:     opts.Resource,
		Endpoint: cmp.Or(opts.Endpoint, opts.SocketPath),
		Versions: []string{pluginapi.Version},
	}, p.log)
	for _, id := range ids {
		p.devices = append(p.devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	return p, nil
}

// Resource returns the resource name.
func (p *Plugin) Resource() string { return p.opts.Resource }

// SocketPath returns the socket the plugin serves on.
func (p *Plugin) SocketPath() string { return p.opts.SocketPath }

// Start listens on the socket (replacing a stale one) and serves
// v1beta1.DevicePlugin and pluginregistration.Registration until Stop.
func (p *Plugin) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.server != nil {
		return errors.New("sampleplugin: already started")
	}
	lis, err := unixsock.Listen(p.opts.SocketPath)
	if err != nil {
		return fmt.Errorf("sampleplugin: listen on %s: %w", p.opts.SocketPath, err)
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, p)
	registerapi.RegisterRegistrationServer(s, p.Registration)
	p.server, p.listener, p.served = s, lis, make(chan struct{})
	served := p.served
	go func() {
		defer close(served)
		if err := s.Serve(lis); err != nil {
			p.log.Error("device plugin server ended", "socket", p.opts.SocketPath, "error", err)
		}
	}()
	p.log.Info("device plugin serving", "resource", p.opts.Resource, "socket", p.opts.SocketPath, "devices", len(p.devices))
	return nil
}

// Stop ends every ListAndWatch stream, stops the server and removes the
// socket. It is safe to call more than once and before Start.
func (p *Plugin) Stop() {
	p.mu.Lock()
	s, served := p.server, p.served
	p.server = nil
	for stop := range p.streams {
		close(stop)
		delete(p.streams, stop)
	}
	p.mu.Unlock()
	if s == nil {
		return
	}
	s.Stop()
	<-served
	_ = os.Remove(p.opts.SocketPath)
}

// Register calls v1beta1 Registration/Register on the kubelet socket at
// kubeletSock, the legacy registration path. The endpoint sent is the
// plugin's socket file name, so the socket must live in the same directory
// as kubeletSock.
func (p *Plugin) Register(ctx context.Context, kubeletSock string) error {
	if filepath.Dir(kubeletSock) != filepath.Dir(p.opts.SocketPath) {
		return fmt.Errorf("sampleplugin: socket %s is not in the directory of %s", p.opts.SocketPath, kubeletSock)
	}
	conn, err := rpcutil.DialPeer(kubeletSock)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.opts.SocketPath),
		ResourceName: p.opts.Resource,
		Options:      p.options(),
	})
	if err != nil {
		return fmt.Errorf("register %s at %s: %w", p.opts.Resource, kubeletSock, err)
	}
	return nil
}

func (p *Plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{
		PreStartRequired:                p.opts.PreStartRequired,
		GetPreferredAllocationAvailable: p.opts.Preferred,
	}
}

// SetHealth sets the health of device id and pushes the new list to every
// ListAndWatch stream.
func (p *Plugin) SetHealth(id string, healthy bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range p.devices {
		if d.ID == id {
			d.Health = pluginapi.Unhealthy
			if healthy {
				d.Health = pluginapi.Healthy
			}
			p.notifyLocked()
			return nil
		}
	}
	return fmt.Errorf("sampleplugin: no device %q", id)
}

// Devices returns a copy of the current device list.
func (p *Plugin) Devices() []*pluginapi.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devicesLocked()
}

func (p *Plugin) devicesLocked() []*pluginapi.Device {
	out := make([]*pluginapi.Device, 0, len(p.devices))
	for _, d := range p.devices {
		dev := &pluginapi.Device{ID: d.ID, Health: d.Health}
		if nodes := p.opts.NUMANodes[d.ID]; nodes != nil {
			dev.Topology = &pluginapi.TopologyInfo{}
			for _, n := range nodes {
				dev.Topology.Nodes = append(dev.Topology.Nodes, &pluginapi.NUMANode{ID: n})
			}
		}
		out = append(out, dev)
	}
	return out
}

func (p *Plugin) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// SetFailure makes every later call of method fail with err (nil clears
// it). For ListAndWatch the stream fails as soon as it is opened.
func (p *Plugin) SetFailure(method string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		delete(p.failures, method)
		return
	}
	p.failures[method] = err
}

// SetPreference makes GetPreferredAllocation answer ids verbatim (nil
// restores the default preference), to test how a caller checks answers.
func (p *Plugin) SetPreference(ids []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prefer = slices.Clone(ids)
}

// FailStreams ends every open ListAndWatch stream with err (nil ends them
// cleanly), leaving the server running.
func (p *Plugin) FailStreams(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for stop, errc := range p.streams {
		errc <- err
		close(stop)
		delete(p.streams, stop)
	}
}

// StreamCount returns the number of open ListAndWatch streams.
func (p *Plugin) StreamCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.streams)
}

// Calls returns a copy of the call log.
func (p *Plugin) Calls() []Call {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.calls)
}

// CallCount returns how often method was called.
func (p *Plugin) CallCount(method string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, c := range p.calls {
		if c.Method == method {
			n++
		}
	}
	return n
}

func (p *Plugin) record(c Call) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, c)
	return p.failures[c.Method]
}

// GetDevicePluginOptions implements v1beta1.DevicePlugin.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	if err := p.record(Call{Method: MethodGetDevicePluginOptions}); err != nil {
		return nil, err
	}
	return p.options(), nil
}

// ListAndWatch implements v1beta1.DevicePlugin: it sends the device list,
// then the list again after every change, until the stream or the plugin
// ends.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := p.record(Call{Method: MethodListAndWatch}); err != nil {
		return err
	}
	stop, errc := make(chan struct{}), make(chan error, 1)
	p.mu.Lock()
	if p.server == nil {
		p.mu.Unlock()
		return status.Error(codes.Unavailable, "device plugin stopping")
	}
	p.streams[stop] = errc
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.streams, stop)
		p.mu.Unlock()
	}()
	for {
		p.mu.Lock()
		devs, changed := p.devicesLocked(), p.changed
		p.mu.Unlock()
		if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stop:
			select {
			case err := <-errc:
				return err
			default:
				return nil
			}
		case <-s.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation implements v1beta1.DevicePlugin: must-include IDs
// first, then the highest available IDs.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		if err := p.record(Call{Method: MethodGetPreferredAllocation, DeviceIDs: cr.GetAvailableDeviceIDs(), MustInclude: cr.GetMustIncludeDeviceIDs(), Size: cr.GetAllocationSize()}); err != nil {
			return nil, err
		}
		p.mu.Lock()
		fixed := p.prefer
		p.mu.Unlock()
		if fixed != nil {
			resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: slices.Clone(fixed)})
			continue
		}
		picked := slices.Clone(cr.GetMustIncludeDeviceIDs())
		avail := slices.Sorted(slices.Values(cr.GetAvailableDeviceIDs()))
		for i := len(avail) - 1; i >= 0 && len(picked) < int(cr.GetAllocationSize()); i-- {
			if !slices.Contains(picked, avail[i]) {
				picked = append(picked, avail[i])
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: picked})
	}
	return resp, nil
}

// Allocate implements v1beta1.DevicePlugin. Unknown or unhealthy device IDs
// are an error, as in the upstream sample plugin.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		ids := cr.GetDevicesIds()
		if err := p.record(Call{Method: MethodAllocate, DeviceIDs: ids}); err != nil {
			return nil, err
		}
		p.mu.Lock()
		for _, id := range ids {
			i := slices.IndexFunc(p.devices, func(d *pluginapi.Device) bool { return d.ID == id })
			if i < 0 || p.devices[i].Health != pluginapi.Healthy {
				p.mu.Unlock()
				return nil, status.Errorf(codes.InvalidArgument, "invalid allocation request for %q: unknown or unhealthy device %q", p.opts.Resource, id)
			}
		}
		p.mu.Unlock()
		resp.ContainerResponses = append(resp.ContainerResponses, p.containerResponse(ids))
	}
	return resp, nil
}

func (p *Plugin) containerResponse(ids []string) *pluginapi.ContainerAllocateResponse {
	var r *pluginapi.ContainerAllocateResponse
	if p.opts.AllocateResponse != nil {
		r = p.opts.AllocateResponse(ids)
	} else {
		r = &pluginapi.ContainerAllocateResponse{
			Envs:        map[string]string{"NODEPLUG_DEVICES": strings.Join(ids, ",")},
			Annotations: map[string]string{"nodeplug.io/resource": p.opts.Resource},
		}
		hostDir := cmp.Or(p.opts.MountHostDir, DefaultMountHostDir)
		for _, id := range ids {
			r.Mounts = append(r.Mounts, &pluginapi.Mount{ContainerPath: "/dev/nodeplug/" + id, HostPath: filepath.Join(hostDir, id), ReadOnly: true})
			r.Devices = append(r.Devices, &pluginapi.DeviceSpec{ContainerPath: "/dev/" + id, HostPath: "/dev/null", Permissions: "rw"})
		}
	}
	if p.opts.CDI {
		for _, id := range ids {
			r.CdiDevices = append(r.CdiDevices, &pluginapi.CDIDevice{Name: p.opts.Resource + "=" + id})
		}
	}
	return r
}

// PreStartContainer implements v1beta1.DevicePlugin; calls are recorded.
func (p *Plugin) PreStartContainer(_ context.Context, req *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	if err := p.record(Call{Method: MethodPreStartContainer, DeviceIDs: req.GetDevicesIds()}); err != nil {
		return nil, err
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}
