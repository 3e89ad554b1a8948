// Package server holds the devicemanager's gRPC faces: the
// DeviceManagerService adapter over the manager, the legacy
// v1beta1.Registration service on kubelet.sock, and the start-up sequence
// (refuse a live kubelet.sock, restore, sweep stale sockets, listen).
package server

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/checkpoint"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/manager"
)

// KubeletSocketName is the legacy registration socket's name.
const KubeletSocketName = "kubelet.sock"

var tracer = telemetry.Tracer("github.com/nodeplug/nodeplug/services/devicemanager")

// Backend is what the gRPC faces need of the device manager. Every method
// is safe for concurrent use; Watch's snapshot and subscription are
// consistent (no change falls between them).
type Backend interface {
	InstanceID() string
	Register(ctx context.Context, r manager.Registration) error
	Deregister(ctx context.Context, resource, endpoint, generation string) (bool, error)
	ListResources() []manager.ResourceInfo
	Watch() ([]manager.Change, *stream.Subscription[manager.Change], uint64)
	Allocate(ctx context.Context, req *manager.AllocateRequest) ([]manager.ResourceAllocation, error)
	Release(ctx context.Context, pod, container string) (int64, error)
	ListAllocations(pod string) []manager.Allocation
}

var _ Backend = (*manager.Manager)(nil)

// Service implements DeviceManagerService over a Backend.
type Service struct {
	dmv1.UnimplementedDeviceManagerServiceServer
	m Backend
}

var _ dmv1.DeviceManagerServiceServer = (*Service)(nil)

// NewService returns the gRPC adapter for m.
func NewService(m Backend) *Service { return &Service{m: m} }

// RegisterPlugin implements DeviceManagerService.
func (s *Service) RegisterPlugin(ctx context.Context, req *dmv1.RegisterPluginRequest) (*dmv1.RegisterPluginResponse, error) {
	err := s.m.Register(ctx, manager.Registration{
		Resource: req.GetResourceName(), Endpoint: req.GetEndpoint(), Versions: req.GetVersions(),
		SocketPath: req.GetSocketPath(), Generation: req.GetGeneration(), Path: manager.PathPluginsRegistry,
	})
	if err != nil {
		return nil, err
	}
	return &dmv1.RegisterPluginResponse{InstanceId: s.m.InstanceID()}, nil
}

// DeregisterPlugin implements DeviceManagerService.
func (s *Service) DeregisterPlugin(ctx context.Context, req *dmv1.DeregisterPluginRequest) (*dmv1.DeregisterPluginResponse, error) {
	removed, err := s.m.Deregister(ctx, req.GetResourceName(), req.GetEndpoint(), req.GetGeneration())
	if err != nil {
		return nil, err
	}
	return &dmv1.DeregisterPluginResponse{InstanceId: s.m.InstanceID(), Removed: removed}, nil
}

// ListResources implements DeviceManagerService.
func (s *Service) ListResources(context.Context, *dmv1.ListResourcesRequest) (*dmv1.ListResourcesResponse, error) {
	out := &dmv1.ListResourcesResponse{InstanceId: s.m.InstanceID()}
	for _, r := range s.m.ListResources() {
		out.Resources = append(out.Resources, resourceToAPI(r))
	}
	return out, nil
}

// WatchResources implements DeviceManagerService.
func (s *Service) WatchResources(req *dmv1.WatchResourcesRequest, ss grpc.ServerStreamingServer[dmv1.WatchResourcesResponse]) error {
	id := s.m.InstanceID()
	snap, sub, rev := s.m.Watch()
	send := func(c manager.Change) error {
		if req.GetOmitDeviceIds() {
			c.Resource.Healthy, c.Resource.Unhealthy, c.Resource.Allocated = nil, nil, nil
		}
		return ss.Send(changeToAPI(id, c))
	}
	return stream.Serve(ss.Context(), snap, sub, send, func() error {
		return ss.Send(&dmv1.WatchResourcesResponse{InstanceId: id, Item: &dmv1.WatchResourcesResponse_Synced{Synced: &dmv1.Synced{Revision: rev}}})
	})
}

// Allocate implements DeviceManagerService.
func (s *Service) Allocate(ctx context.Context, req *dmv1.AllocateRequest) (*dmv1.AllocateResponse, error) {
	allocs, err := s.m.Allocate(ctx, allocateRequestFromAPI(req))
	if err != nil {
		return nil, err
	}
	out := &dmv1.AllocateResponse{PodUid: req.GetPodUid(), ContainerName: req.GetContainerName()}
	for _, a := range allocs {
		out.Allocations = append(out.Allocations, resourceAllocationToAPI(a))
	}
	return out, nil
}

// Release implements DeviceManagerService.
func (s *Service) Release(ctx context.Context, req *dmv1.ReleaseRequest) (*dmv1.ReleaseResponse, error) {
	n, err := s.m.Release(ctx, req.GetPodUid(), req.GetContainerName())
	if err != nil {
		return nil, err
	}
	return &dmv1.ReleaseResponse{ReleasedDevices: n}, nil
}

// ListAllocations implements DeviceManagerService.
func (s *Service) ListAllocations(_ context.Context, req *dmv1.ListAllocationsRequest) (*dmv1.ListAllocationsResponse, error) {
	out := &dmv1.ListAllocationsResponse{InstanceId: s.m.InstanceID()}
	for _, a := range s.m.ListAllocations(req.GetPodUid()) {
		out.Allocations = append(out.Allocations, allocationToAPI(a))
	}
	return out, nil
}

// Registration serves v1beta1.Registration/Register on kubelet.sock.
type Registration struct {
	pluginapi.UnimplementedRegistrationServer
	m   Backend
	dir string
	log *slog.Logger
}

var _ pluginapi.RegistrationServer = (*Registration)(nil)

// Register implements v1beta1.Registration: the endpoint is a file name in
// the device-plugins directory, joined to it at once. Each legacy
// registration starts its own trace.
func (r *Registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	ctx, span := tracer.Start(ctx, "legacy Register "+req.GetResourceName(), trace.WithNewRoot())
	defer span.End()
	ep := req.GetEndpoint()
	if ep == "" || strings.Contains(ep, "/") || ep == "." || ep == ".." {
		return nil, fmt.Errorf("endpoint %q must be a socket file name in %s: %w", ep, r.dir, errdefs.ErrInvalidArgument)
	}
	err := r.m.Register(ctx, manager.Registration{
		Resource: req.GetResourceName(), Endpoint: filepath.Join(r.dir, ep), Versions: []string{req.GetVersion()},
		Path: manager.PathKubeletSock,
	})
	if err != nil {
		r.log.WarnContext(ctx, "legacy Register failed", "resource", req.GetResourceName(), "endpoint", ep, "error", err)
		return nil, err
	}
	return &pluginapi.Empty{}, nil
}

// ErrKubeletRunning is returned by Start when a kubelet.sock in the
// device-plugins directory answers.
var ErrKubeletRunning = errors.New("a kubelet.sock in the device-plugins directory answers: another kubelet or devicemanager owns it")

// Config configures Start.
type Config struct {
	DevicePluginsDir string
	Log              *slog.Logger
}

// Legacy is the running kubelet.sock server.
type Legacy struct {
	server *grpc.Server
	lis    net.Listener
	path   string
}

// CheckKubeletSocket fails with ErrKubeletRunning when something answers on
// kubelet.sock in dir.
func CheckKubeletSocket(dir string) error {
	path := filepath.Join(dir, KubeletSocketName)
	if !unixsock.IsSocket(path) {
		return nil
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil // stale: nothing listens
	}
	_ = c.Close()
	return fmt.Errorf("%s: %w", path, ErrKubeletRunning)
}

// Sweep removes every socket in dir (not recursively) except kubelet.sock
// and those in keep, as the kubelet does at start: plugins on the legacy
// path notice their socket is gone and register again. Other files (the
// checkpoints) are left alone.
func Sweep(dir string, keep map[string]bool, log *slog.Logger) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if e.Name() == KubeletSocketName || e.Name() == checkpoint.FileName || e.IsDir() || keep[p] {
			continue
		}
		if e.Type()&fs.ModeSocket == 0 {
			continue
		}
		if resolved, err := filepath.EvalSymlinks(p); err == nil && keep[resolved] {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		log.Info("removed stale device plugin socket", "socket", p)
	}
	return errors.Join(errs...)
}

// ListenKubeletSocket serves v1beta1.Registration for m on
// <dir>/kubelet.sock until Stop.
func ListenKubeletSocket(m Backend, dir string, log *slog.Logger) (*Legacy, error) {
	path := filepath.Join(dir, KubeletSocketName)
	lis, err := unixsock.Listen(path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	s, _ := rpcutil.NewServer(log)
	pluginapi.RegisterRegistrationServer(s, &Registration{m: m, dir: dir, log: log})
	l := &Legacy{server: s, lis: lis, path: path}
	return l, nil
}

// Serve serves until Stop.
func (l *Legacy) Serve() error {
	if err := l.server.Serve(l.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("kubelet.sock server: %w", err)
	}
	return nil
}

// Path returns the kubelet.sock path.
func (l *Legacy) Path() string { return l.path }

// Stop stops serving and removes kubelet.sock.
func (l *Legacy) Stop() {
	done := make(chan struct{})
	go func() { l.server.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		l.server.Stop()
		<-done
	}
	_ = os.Remove(l.path)
}
