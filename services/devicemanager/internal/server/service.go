// Package server holds the devicemanager's gRPC adapters and nothing more:
// DeviceManagerService (nodeplug's own API) and the legacy
// v1beta1.Registration service that plugins call on kubelet.sock, each a
// thin shell over the manager, and the conversion between the generated
// types and the manager's. WatchResources streams are bounded by the
// manager's Watch hub (manager.Config.WatchLimits, pkg/stream's bounds, as
// every Watch RPC of nodeplug). DeviceManagerService's errors pass
// through unchanged: the server interceptor (pkg/rpcutil) maps their errdefs
// sentinels to status codes. The legacy Register answers as the kubelet's
// does instead: plain errors (code Unknown) in the kubelet's words.
//
// main.go builds the servers and serves them; nothing here listens.
package server

import (
	"context"

	"google.golang.org/grpc"
	grpccodes "google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/containerstart"
)

var tracer = telemetry.Tracer("github.com/nodeplug/nodeplug/services/devicemanager")

// Backend is what DeviceManagerService needs of the device manager. Every
// method is safe for concurrent use; Watch's snapshot and subscription are
// consistent (no change falls between them).
type Backend interface {
	InstanceID() string
	Register(ctx context.Context, r manager.Registration) error
	Deregister(ctx context.Context, resource, endpoint, generation string) (bool, error)
	ListResources() []manager.ResourceInfo
	Watch(opts manager.WatchOptions) (uint64, *stream.Subscription[manager.Change], error)
	Allocate(ctx context.Context, req *allocator.Request) ([]allocator.ResourceAllocation, error)
	Release(ctx context.Context, pod, container string) (int64, error)
	ListAllocations(pod string) []allocator.Allocation
}

var _ Backend = (*manager.Manager)(nil)

// ClaimReleaser drops a released pod from the DRA claims it uses
// (claims.Manager).
type ClaimReleaser interface {
	ReleasePod(ctx context.Context, podUID string) (int, error)
}

// Starter answers container starts (containerstart.Starter).
type Starter interface {
	Start(ctx context.Context, pod, container string) (containerstart.Result, error)
}

// Service implements DeviceManagerService over a Backend.
type Service struct {
	dmv1.UnimplementedDeviceManagerServiceServer
	m       Backend
	claims  ClaimReleaser
	starter Starter
}

var _ dmv1.DeviceManagerServiceServer = (*Service)(nil)

// NewService returns the gRPC adapter for m.
func NewService(m Backend) *Service {
	return &Service{m: m}
}

// WithClaims makes a Release of a whole pod also release its DRA claims.
// It is called before serving.
func (s *Service) WithClaims(c ClaimReleaser) *Service {
	s.claims = c
	return s
}

// WithStarter serves StartContainer. It is called before serving.
func (s *Service) WithStarter(st Starter) *Service {
	s.starter = st
	return s
}

// RegisterPlugin implements DeviceManagerService.
func (s *Service) RegisterPlugin(ctx context.Context, req *dmv1.RegisterPluginRequest) (*dmv1.RegisterPluginResponse, error) {
	if err := s.m.Register(ctx, registrationFromAPI(req)); err != nil {
		// The kubelet's words, when the error has them, travel as an
		// ErrorInfo detail (kubeletrules.Status) for the reconciler to tell
		// the plugin.
		return nil, kubeletrules.Status(err)
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

// WatchResources implements DeviceManagerService: the snapshot, the synced
// marker, then live changes (stream.Serve), within the bounds of the
// manager's Watch hub: a stream that does not fit, or a client that falls
// too far behind, gets RESOURCE_EXHAUSTED and resubscribes.
func (s *Service) WatchResources(req *dmv1.WatchResourcesRequest, ss grpc.ServerStreamingServer[dmv1.WatchResourcesResponse]) error {
	omit := req.GetOmitDeviceIds()
	rev, sub, err := s.m.Watch(manager.WatchOptions{OmitDeviceIDs: omit, OmitAllocationChanges: req.GetOmitAllocationChanges()})
	if err != nil {
		return err
	}
	id := s.m.InstanceID()
	send := func(c manager.Change) error {
		if omit {
			c = c.WithoutDeviceIDs()
		}
		return ss.Send(changeToAPI(id, c))
	}
	synced := func() error {
		return ss.Send(&dmv1.WatchResourcesResponse{InstanceId: id, Item: &dmv1.WatchResourcesResponse_Synced{Synced: &dmv1.Synced{Revision: rev}}})
	}
	return stream.Serve(ss.Context(), sub, send, synced)
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
		out.PodNamespace, out.PodName, out.ContainerKind = a.PodNamespace, a.PodName, kindToAPI(a.Kind)
	}
	return out, nil
}

// Release implements DeviceManagerService: the devices, then, for a whole
// pod, its DRA claims (WithClaims). A failure of either is the call's
// error; what was released stays released, and a retry releases the rest.
func (s *Service) Release(ctx context.Context, req *dmv1.ReleaseRequest) (*dmv1.ReleaseResponse, error) {
	n, err := s.m.Release(ctx, req.GetPodUid(), req.GetContainerName())
	if err != nil {
		return nil, err
	}
	out := &dmv1.ReleaseResponse{ReleasedDevices: n}
	if s.claims != nil && req.GetContainerName() == "" {
		c, err := s.claims.ReleasePod(ctx, req.GetPodUid())
		if err != nil {
			return nil, err
		}
		out.ReleasedClaims = int64(c)
	}
	return out, nil
}

// ListAllocations implements DeviceManagerService.
func (s *Service) ListAllocations(_ context.Context, req *dmv1.ListAllocationsRequest) (*dmv1.ListAllocationsResponse, error) {
	out := &dmv1.ListAllocationsResponse{InstanceId: s.m.InstanceID()}
	for _, a := range s.m.ListAllocations(req.GetPodUid()) {
		out.Allocations = append(out.Allocations, allocationToAPI(a))
	}
	return out, nil
}

// StartContainer implements DeviceManagerService.
func (s *Service) StartContainer(ctx context.Context, req *dmv1.StartContainerRequest) (*dmv1.StartContainerResponse, error) {
	if s.starter == nil {
		return nil, status.Error(grpccodes.Unimplemented, "container start is not served by this devicemanager")
	}
	r, err := s.starter.Start(ctx, req.GetPodUid(), req.GetContainerName())
	if err != nil {
		return nil, err
	}
	return &dmv1.StartContainerResponse{
		PodUid: req.GetPodUid(), ContainerName: req.GetContainerName(),
		CdiDevices: r.CDIDevices, Edits: editsToAPI(r.Edits), CdiSpecDirs: r.SpecDirs, PreStartedResources: r.PreStarted,
	}, nil
}
