package draserver

import (
	"context"
	"fmt"
	"slices"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimview"
)

// Claims is what the service needs of the claims (claimview.View over
// the claims manager).
type Claims interface {
	Prepare(ctx context.Context, req claims.PrepareRequest) ([]claims.ContainerResult, error)
	List(ctx context.Context, opts claimview.ListOptions) ([]claimview.Claim, error)
}

var (
	_ Claims = (*claimview.View)(nil)
	// The view also serves Pods, so that a pod's release forgets its
	// failed prepares (ListClaims shows them until then).
	_ Pods = (*claimview.View)(nil)
)

// Option configures a Service.
type Option func(*Service)

// WithClaims serves PrepareResources and ListClaims with c; without it
// they are unavailable.
func WithClaims(c Claims) Option { return func(s *Service) { s.claims = c } }

func prepareFromAPI(req *dmv1.PrepareResourcesRequest) claims.PrepareRequest {
	out := claims.PrepareRequest{Pod: claims.PodRef{UID: req.GetPodUid(), Namespace: req.GetPodNamespace(), Name: req.GetPodName()}}
	for _, pc := range req.GetPodClaims() {
		out.PodClaims = append(out.PodClaims, claims.PodClaim{Name: pc.GetName(), ResourceClaimName: pc.GetResourceClaimName()})
	}
	for _, c := range req.GetContainers() {
		cc := claims.ContainerClaims{Container: c.GetName()}
		for _, x := range c.GetClaims() {
			cc.Claims = append(cc.Claims, claims.ContainerClaim{Name: x.GetName(), Request: x.GetRequest()})
		}
		out.Containers = append(out.Containers, cc)
	}
	return out
}

func containerToAPI(c claims.ContainerResult) *dmv1.ContainerResources {
	out := &dmv1.ContainerResources{Name: c.Container, CdiDeviceIds: slices.Clone(c.CDIDeviceIDs)}
	for _, d := range c.Devices {
		out.Devices = append(out.Devices, &dmv1.PreparedDevice{
			ClaimNamespace: d.Claim.Namespace, ClaimName: d.Claim.Name, ClaimUid: d.Claim.UID,
			Requests: slices.Clone(d.Requests), Driver: d.Driver, Pool: d.Pool, Device: d.Device.Device,
			CdiDeviceIds: slices.Clone(d.CDIDeviceIDs),
		})
	}
	return out
}

// PrepareResources implements DRAService.
func (s *Service) PrepareResources(ctx context.Context, req *dmv1.PrepareResourcesRequest) (*dmv1.PrepareResourcesResponse, error) {
	if s.claims == nil {
		return nil, fmt.Errorf("this dramanager does not prepare ResourceClaims: %w", errdefs.ErrUnavailable)
	}
	res, err := s.claims.Prepare(ctx, prepareFromAPI(req))
	if err != nil {
		return nil, err
	}
	out := &dmv1.PrepareResourcesResponse{InstanceId: s.instanceID}
	for _, c := range res {
		out.Containers = append(out.Containers, containerToAPI(c))
	}
	return out, nil
}

// ListClaims implements DRAService.
func (s *Service) ListClaims(ctx context.Context, req *dmv1.ListClaimsRequest) (*dmv1.ListClaimsResponse, error) {
	if s.claims == nil {
		return nil, fmt.Errorf("this dramanager does not prepare ResourceClaims: %w", errdefs.ErrUnavailable)
	}
	list, err := s.claims.List(ctx, claimview.ListOptions{Namespace: req.GetNamespace(), All: req.GetAll()})
	if err != nil {
		return nil, err
	}
	out := &dmv1.ListClaimsResponse{InstanceId: s.instanceID, Claims: make([]*dmv1.Claim, 0, len(list))}
	for i := range list {
		out.Claims = append(out.Claims, claimToAPI(&list[i]))
	}
	return out, nil
}

func claimToAPI(c *claimview.Claim) *dmv1.Claim {
	out := &dmv1.Claim{
		Namespace: c.Namespace, Name: c.Name, Uid: c.UID, ResourceVersion: c.ResourceVersion,
		CreationTime: timestamp(c.Created), AllocatedHere: c.AllocatedHere, AllocatedNode: c.AllocatedNode,
		CdiDeviceIds: slices.Clone(c.CDIDeviceIDs), State: claimStateToAPI[c.State], Reason: c.Reason,
	}
	for _, p := range c.Pods {
		out.Pods = append(out.Pods, &dmv1.ClaimPod{Uid: p.UID, Name: p.Name})
	}
	for _, d := range c.Devices {
		out.Devices = append(out.Devices, &dmv1.ClaimDevice{
			Requests: slices.Clone(d.Requests), Driver: d.Driver, Pool: d.Pool, Device: d.Device,
			CdiDeviceIds: slices.Clone(d.CDIDeviceIDs), Health: d.Health, HealthMessage: d.HealthMessage,
		})
	}
	return out
}

var claimStateToAPI = map[claimview.State]dmv1.ClaimState{
	claimview.Pending:     dmv1.ClaimState_CLAIM_STATE_PENDING,
	claimview.Allocated:   dmv1.ClaimState_CLAIM_STATE_ALLOCATED,
	claimview.Prepared:    dmv1.ClaimState_CLAIM_STATE_PREPARED,
	claimview.Unpreparing: dmv1.ClaimState_CLAIM_STATE_UNPREPARING,
	claimview.Failed:      dmv1.ClaimState_CLAIM_STATE_FAILED,
}
