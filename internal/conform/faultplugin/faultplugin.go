// Package faultplugin is a device plugin with one fault knob per rule that
// nodeplugctl conform checks, built directly on the upstream API packages
// (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 and
// pluginregistration/v1). With no fault it keeps every rule; each Fault
// breaks exactly one, so the tests of internal/conform show that every
// check fails when its rule is broken and passes when it is kept.
//
// Start serves it in-process on a socket; Main runs it as a process (the
// lifecycle checks need one), registering through plugins_registry or
// kubelet.sock under $NODEPLUG_ROOT_DIR.
package faultplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Fault names one broken rule.
type Fault string

// The faults, one per rule conform checks.
const (
	// GetInfo answers an unknown plugin type.
	FaultInfoType Fault = "info-type"
	// GetInfo answers a name that is not an extended resource name.
	FaultInfoName Fault = "info-name"
	// GetInfo answers versions without v1beta1.
	FaultInfoVersions Fault = "info-versions"
	// GetInfo answers a relative endpoint.
	FaultInfoEndpoint Fault = "info-endpoint"
	// NotifyRegistrationStatus fails.
	FaultNotifyError Fault = "notify-error"
	// Register on kubelet.sock names an unsupported version.
	FaultRegisterVersion Fault = "register-version"
	// Register names an invalid resource.
	FaultRegisterResource Fault = "register-resource"
	// Register names its endpoint by absolute path, not file name.
	FaultRegisterEndpoint Fault = "register-endpoint"
	// GetDevicePluginOptions fails.
	FaultOptionsError Fault = "options-error"
	// ListAndWatch never sends.
	FaultNoFirstResponse Fault = "no-first-response"
	// Two devices share an ID.
	FaultDuplicateIDs Fault = "duplicate-ids"
	// A device ID holds a control character.
	FaultUnprintableID Fault = "unprintable-id"
	// A device's health is neither Healthy nor Unhealthy.
	FaultBadHealth Fault = "bad-health"
	// A device names NUMA node -1.
	FaultBadTopology Fault = "bad-topology"
	// ListAndWatch resends every 10 ms, flipping a device's health.
	FaultFlap Fault = "flap"
	// Allocate answers one container response whatever was asked.
	FaultAllocateOneResponse Fault = "allocate-one-response"
	// Allocate accepts device IDs it does not have.
	FaultAllocateUnknown Fault = "allocate-accepts-unknown"
	// GetPreferredAllocation answers a device that was not available.
	FaultPreferredForeign Fault = "preferred-foreign"
	// PreStartContainer fails.
	FaultPreStartError Fault = "prestart-error"
	// Allocate fails while another Allocate is in flight (each call
	// waits up to a second for a peer, so the overlap is certain).
	FaultAllocateNotConcurrent Fault = "allocate-not-concurrent"
	// Only the first ListAndWatch stream ever gets a response.
	FaultSingleStream Fault = "single-stream"
	// When a ListAndWatch stream ends the plugin stops serving (the
	// restart-path bug of a real GPU plugin); as a process it exits 2.
	FaultStopOnStreamEnd Fault = "stop-on-stream-end"
	// It does not register again when kubelet.sock is re-created.
	FaultNoReregister Fault = "no-reregister"
	// As a process it exits 2 when its socket is removed.
	FaultExitOnSocketRemoval Fault = "exit-on-socket-removal"
	// As a process it exits on SIGTERM without removing its socket.
	FaultKeepSocket Fault = "keep-socket"
	// As a process it ignores SIGTERM.
	FaultIgnoreSIGTERM Fault = "ignore-sigterm"
	// A CSIPlugin or DRAPlugin serves no CSI or DRA service on its
	// endpoint.
	FaultNoDriverService Fault = "no-driver-service"
	// A second after a stream other than the first ends, the plugin stops
	// serving (a plugin that survives one kubelet restart, not two); as a
	// process it exits 2.
	FaultStopAfterSecondStreamEnd Fault = "stop-after-second-stream-end"
)

// Faults lists every fault.
var Faults = []Fault{
	FaultInfoType, FaultInfoName, FaultInfoVersions, FaultInfoEndpoint, FaultNotifyError,
	FaultRegisterVersion, FaultRegisterResource, FaultRegisterEndpoint, FaultOptionsError,
	FaultNoFirstResponse, FaultDuplicateIDs, FaultUnprintableID, FaultBadHealth, FaultBadTopology,
	FaultFlap, FaultAllocateOneResponse, FaultAllocateUnknown, FaultPreferredForeign,
	FaultPreStartError, FaultAllocateNotConcurrent, FaultSingleStream, FaultStopOnStreamEnd,
	FaultNoReregister, FaultExitOnSocketRemoval, FaultKeepSocket, FaultIgnoreSIGTERM,
	FaultNoDriverService, FaultStopAfterSecondStreamEnd,
}

// Resource is the plugin's resource name.
const Resource = "conform.example.com/dev"

// Options configure a Plugin.
type Options struct {
	// Socket is where it listens.
	Socket string
	// Type and Versions, when set, replace what GetInfo answers (a CSI or
	// DRA registration socket).
	Type     string
	Versions []string
	Faults   []Fault
	// DevicePluginOnly serves no pluginregistration.Registration: a
	// device plugin socket of a plugin that registers on kubelet.sock.
	DevicePluginOnly bool
	// Resource is the resource it serves (default Resource).
	Resource string
	// EmptyFirst makes every ListAndWatch stream send an empty device
	// list first and the devices 50 ms later, as plugins that scan their
	// hardware after the stream opens do (Intel's GPU plugin). It breaks
	// no rule.
	EmptyFirst bool
}

// Plugin is the device plugin. It is safe for concurrent use.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	registerapi.UnimplementedRegistrationServer

	opts Options

	mu       sync.Mutex
	streams  int
	inflight int
	peer     chan struct{} // closed when a second Allocate is in flight
	srv      *grpc.Server
	served   chan struct{}
	stopped  chan struct{} // closed when the plugin stopped itself
	stopOnce sync.Once
	notified []*registerapi.RegistrationStatus
}

// Has reports whether the plugin has fault f.
func (p *Plugin) Has(f Fault) bool { return slices.Contains(p.opts.Faults, f) }

// New returns a plugin that does not serve yet.
func New(opts Options) *Plugin {
	return &Plugin{opts: opts, stopped: make(chan struct{}), peer: make(chan struct{})}
}

// Start serves the plugin in-process on opts.Socket until Stop.
func Start(opts Options) (*Plugin, error) {
	if opts.Resource == "" {
		opts.Resource = Resource
	}
	p := New(opts)
	return p, p.Serve()
}

// Serve listens on the socket (replacing a stale one) and serves in the
// background.
func (p *Plugin) Serve() error {
	_ = os.Remove(p.opts.Socket)
	lis, err := net.Listen("unix", p.opts.Socket)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	if !p.opts.DevicePluginOnly {
		registerapi.RegisterRegistrationServer(srv, p)
	}
	if !p.Has(FaultNoDriverService) {
		switch p.opts.Type {
		case registerapi.CSIPlugin:
			csi.RegisterIdentityServer(srv, driverServices{})
			csi.RegisterNodeServer(srv, driverServices{})
		case registerapi.DRAPlugin:
			drav1.RegisterDRAPluginServer(srv, driverServices{})
		}
	}
	served := make(chan struct{})
	p.mu.Lock()
	p.srv, p.served = srv, served
	p.mu.Unlock()
	go func() {
		defer close(served)
		_ = srv.Serve(lis)
	}()
	return nil
}

// Stop stops serving (the socket goes with the listener).
func (p *Plugin) Stop() {
	p.mu.Lock()
	srv, served := p.srv, p.served
	p.srv = nil
	p.mu.Unlock()
	if srv != nil {
		srv.Stop()
		<-served
	}
}

// Stopped is closed when the plugin stopped itself (FaultStopOnStreamEnd).
func (p *Plugin) Stopped() <-chan struct{} { return p.stopped }

// Socket returns the socket path.
func (p *Plugin) Socket() string { return p.opts.Socket }

// GetInfo implements pluginregistration.Registration.
func (p *Plugin) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	info := &registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: p.resource(), SupportedVersions: []string{pluginapi.Version}}
	if p.opts.Type != "" {
		info.Type, info.SupportedVersions = p.opts.Type, p.opts.Versions
	}
	if p.Has(FaultInfoType) {
		info.Type = "GPUPlugin"
	}
	if p.Has(FaultInfoName) {
		info.Name = "no-domain"
	}
	if p.Has(FaultInfoVersions) {
		info.SupportedVersions = []string{"v1alpha1"}
	}
	if p.Has(FaultInfoEndpoint) {
		info.Endpoint = "relative.sock"
	}
	return info, nil
}

// resource is the resource the plugin serves.
func (p *Plugin) resource() string {
	if p.opts.Resource == "" {
		return Resource
	}
	return p.opts.Resource
}

// Notified returns the registration statuses the plugin was told, in
// order.
func (p *Plugin) Notified() []*registerapi.RegistrationStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.notified)
}

// NotifyRegistrationStatus implements pluginregistration.Registration.
func (p *Plugin) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	p.mu.Lock()
	p.notified = append(p.notified, st)
	p.mu.Unlock()
	if p.Has(FaultNotifyError) {
		return nil, status.Error(codes.Internal, "notification refused")
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

func (p *Plugin) options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{PreStartRequired: true, GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions implements v1beta1.DevicePlugin.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	if p.Has(FaultOptionsError) {
		return nil, status.Error(codes.Internal, "no options today")
	}
	return p.options(), nil
}

// ids are the plugin's devices.
var ids = []string{"dev-0", "dev-1", "dev-2", "dev-3"}

func (p *Plugin) devices(flip bool) []*pluginapi.Device {
	var out []*pluginapi.Device
	for _, id := range ids {
		out = append(out, &pluginapi.Device{ID: id, Health: pluginapi.Healthy,
			Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: 0}}}})
	}
	if flip {
		out[0].Health = pluginapi.Unhealthy
	}
	if p.Has(FaultDuplicateIDs) {
		out[1].ID = out[0].ID
	}
	if p.Has(FaultUnprintableID) {
		out[1].ID = "dev\x001"
	}
	if p.Has(FaultBadHealth) {
		out[1].Health = "OK"
	}
	if p.Has(FaultBadTopology) {
		out[1].Topology.Nodes[0].ID = -1
	}
	return out
}

// ListAndWatch implements v1beta1.DevicePlugin.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	p.mu.Lock()
	p.streams++
	n := p.streams
	p.mu.Unlock()
	ctx := s.Context()
	if p.Has(FaultStopOnStreamEnd) {
		defer func() {
			if ctx.Err() != nil {
				p.stopSelf()
			}
		}()
	}
	if p.Has(FaultStopAfterSecondStreamEnd) && n > 1 {
		defer func() {
			if ctx.Err() != nil {
				time.AfterFunc(time.Second, p.stopSelf)
			}
		}()
	}
	if p.Has(FaultNoFirstResponse) || (p.Has(FaultSingleStream) && n > 1) {
		<-ctx.Done()
		return nil
	}
	if p.opts.EmptyFirst {
		if err := s.Send(&pluginapi.ListAndWatchResponse{}); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices(false)}); err != nil {
		return err
	}
	if !p.Has(FaultFlap) {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for flip := true; ; flip = !flip {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices(flip)}); err != nil {
				return err
			}
		}
	}
}

// stopSelf stops the server from inside a handler, as a plugin that gives
// up when a send fails.
func (p *Plugin) stopSelf() {
	p.stopOnce.Do(func() {
		close(p.stopped)
		go p.Stop()
	})
}

// GetPreferredAllocation implements v1beta1.DevicePlugin: the must-include
// devices, then the lowest available ones, up to the size.
func (p *Plugin) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, cr := range req.GetContainerRequests() {
		got := slices.Clone(cr.GetMustIncludeDeviceIDs())
		for _, id := range cr.GetAvailableDeviceIDs() {
			if len(got) >= int(cr.GetAllocationSize()) {
				break
			}
			if !slices.Contains(got, id) {
				got = append(got, id)
			}
		}
		if p.Has(FaultPreferredForeign) {
			got = append(got[:0], "foreign-device")
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: got})
	}
	return resp, nil
}

// Allocate implements v1beta1.DevicePlugin.
func (p *Plugin) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	if p.Has(FaultAllocateNotConcurrent) {
		if err := p.enterAlone(ctx); err != nil {
			return nil, err
		}
		defer p.leave()
	}
	resp := &pluginapi.AllocateResponse{}
	for _, cr := range req.GetContainerRequests() {
		for _, id := range cr.GetDevicesIds() {
			if !slices.Contains(ids, id) && !p.Has(FaultAllocateUnknown) {
				return nil, status.Errorf(codes.InvalidArgument, "unknown device %q", id)
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{"CONFORM_DEVICES": fmt.Sprint(cr.GetDevicesIds())},
		})
	}
	if p.Has(FaultAllocateOneResponse) && len(resp.ContainerResponses) > 1 {
		resp.ContainerResponses = resp.ContainerResponses[:1]
	}
	return resp, nil
}

// enterAlone fails when another Allocate is in flight; alone, it waits up
// to a second for one to arrive.
func (p *Plugin) enterAlone(ctx context.Context) error {
	p.mu.Lock()
	if p.inflight > 0 {
		select {
		case <-p.peer:
		default:
			close(p.peer)
		}
		p.mu.Unlock()
		return status.Error(codes.Unavailable, "busy: another Allocate is in flight")
	}
	p.inflight++
	peer := p.peer
	p.mu.Unlock()
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-peer:
	case <-t.C:
	case <-ctx.Done():
	}
	return nil
}

func (p *Plugin) leave() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight--
	if p.inflight == 0 {
		select {
		case <-p.peer:
			p.peer = make(chan struct{})
		default:
		}
	}
}

// PreStartContainer implements v1beta1.DevicePlugin.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	if p.Has(FaultPreStartError) {
		return nil, status.Error(codes.Internal, "prestart failed")
	}
	return &pluginapi.PreStartContainerResponse{}, nil
}

// driverServices are the CSI (Identity, Node) and DRA (v1.DRAPlugin)
// services of a plugin that registers as CSIPlugin or DRAPlugin: NodeGetInfo
// names a node, and an empty prepare or unprepare succeeds.
type driverServices struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	drav1.UnimplementedDRAPluginServer
}

// NodeGetInfo implements csi.NodeServer.
func (driverServices) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: "conform-node"}, nil
}

// NodePrepareResources implements drav1.DRAPluginServer.
func (driverServices) NodePrepareResources(context.Context, *drav1.NodePrepareResourcesRequest) (*drav1.NodePrepareResourcesResponse, error) {
	return &drav1.NodePrepareResourcesResponse{}, nil
}

// NodeUnprepareResources implements drav1.DRAPluginServer.
func (driverServices) NodeUnprepareResources(context.Context, *drav1.NodeUnprepareResourcesRequest) (*drav1.NodeUnprepareResourcesResponse, error) {
	return &drav1.NodeUnprepareResourcesResponse{}, nil
}
