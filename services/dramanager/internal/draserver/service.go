// Package draserver is the gRPC adapter of DRAService: driver
// registrations go to the DRA registry (package dra/drivers), the slices are read
// from the Kubernetes API (Slices), their devices' health from the
// registry; PrepareResources goes to the claims manager (Claims) and
// ListClaims joins the API's claims with the manager's records. Errors pass through unchanged: the
// server interceptor (pkg/rpcutil) maps their errdefs sentinels to status
// codes. WatchResourceSlices streams are bounded by the Slices hub (as
// every Watch RPC of nodeplug, pkg/stream) and, per caller, by the API
// server's access.WatchBounds.
//
// main.go builds the service and registers it; nothing here listens.
package draserver

import (
	"context"

	"google.golang.org/grpc"
	resourcev1 "k8s.io/api/resource/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/slicewatch"
)

// Slices is what the service needs of this node's slices
// (slicewatch.Slices).
type Slices interface {
	List(ctx context.Context, driver string) ([]resourcev1.ResourceSlice, error)
	Watch(ctx context.Context, driver string) (uint64, *stream.Subscription[slicewatch.Change], error)
}

var _ Slices = (*slicewatch.Slices)(nil)

// Service implements DRAService.
type Service struct {
	dmv1.UnimplementedDRAServiceServer
	instanceID string
	reg        *drivers.Registry
	slices     Slices
	claims     Claims
	pods       Pods
}

var _ dmv1.DRAServiceServer = (*Service)(nil)

// NewService returns the adapter; instanceID is the dramanager's. The
// claims are listed through the slices' Kubernetes client.
func NewService(instanceID string, reg *drivers.Registry, slices Slices, opts ...Option) *Service {
	s := &Service{instanceID: instanceID, reg: reg, slices: slices}
	for _, o := range opts {
		o(s)
	}
	return s
}

// RegisterDRADriver implements DRAService.
func (s *Service) RegisterDRADriver(ctx context.Context, req *dmv1.RegisterDRADriverRequest) (*dmv1.RegisterDRADriverResponse, error) {
	r, err := registrationFromAPI(req)
	if err != nil {
		return nil, err
	}
	in, err := s.reg.Register(ctx, r)
	if err != nil {
		return nil, err
	}
	return &dmv1.RegisterDRADriverResponse{InstanceId: s.instanceID, Instance: instanceToAPI(in)}, nil
}

// DeregisterDRADriver implements DRAService.
func (s *Service) DeregisterDRADriver(ctx context.Context, req *dmv1.DeregisterDRADriverRequest) (*dmv1.DeregisterDRADriverResponse, error) {
	endpoint, err := bounds.PathFromWire(req.GetEndpoint(), req.GetEndpointBytes())
	if err != nil {
		return nil, err
	}
	removed, err := s.reg.Deregister(ctx, req.GetDriverName(), endpoint, req.GetGeneration())
	if err != nil {
		return nil, err
	}
	return &dmv1.DeregisterDRADriverResponse{InstanceId: s.instanceID, Removed: removed}, nil
}

// ListDRADrivers implements DRAService.
func (s *Service) ListDRADrivers(_ context.Context, req *dmv1.ListDRADriversRequest) (*dmv1.ListDRADriversResponse, error) {
	out := &dmv1.ListDRADriversResponse{InstanceId: s.instanceID}
	for _, d := range s.reg.Drivers(req.GetDriverName()) {
		out.Drivers = append(out.Drivers, driverToAPI(d))
	}
	return out, nil
}

// ListResourceSlices implements DRAService.
func (s *Service) ListResourceSlices(ctx context.Context, req *dmv1.ListResourceSlicesRequest) (*dmv1.ListResourceSlicesResponse, error) {
	list, err := s.slices.List(ctx, req.GetDriverName())
	if err != nil {
		return nil, err
	}
	items := make([]*dmv1.ResourceSlice, 0, len(list))
	for i := range list {
		items = append(items, sliceToAPI(&list[i]))
	}
	if s.reg != nil {
		for _, sl := range items {
			for _, d := range sl.GetDevices() {
				d.Health, d.HealthMessage = s.reg.Health(sl.GetDriver(), sl.GetPool().GetName(), d.GetName())
			}
		}
	}
	return &dmv1.ListResourceSlicesResponse{InstanceId: s.instanceID, Slices: items}, nil
}

// WatchResourceSlices implements DRAService: the snapshot, the synced
// marker, then live changes (stream.Serve); a stream that does not fit, or
// a client that falls too far behind, gets RESOURCE_EXHAUSTED.
func (s *Service) WatchResourceSlices(req *dmv1.WatchResourceSlicesRequest, ss grpc.ServerStreamingServer[dmv1.WatchResourceSlicesResponse]) error {
	rev, sub, err := s.slices.Watch(ss.Context(), req.GetDriverName())
	if err != nil {
		return err
	}
	send := func(c slicewatch.Change) error {
		return ss.Send(&dmv1.WatchResourceSlicesResponse{InstanceId: s.instanceID, Item: &dmv1.WatchResourceSlicesResponse_Change{
			Change: &dmv1.ResourceSliceChange{Type: changeTypeToAPI(c.Type), Slice: sliceToAPI(c.Slice), Revision: c.Rev},
		}})
	}
	synced := func() error {
		return ss.Send(&dmv1.WatchResourceSlicesResponse{InstanceId: s.instanceID, Item: &dmv1.WatchResourceSlicesResponse_Synced{Synced: &dmv1.Synced{Revision: rev}}})
	}
	return stream.Serve(ss.Context(), sub, send, synced)
}
