package drivers

import (
	"context"
	"errors"
	"fmt"
	"slices"

	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drapbv1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

var _ claims.Drivers = (*Registry)(nil)

// client is the DRA service of one connection in v1 terms: v1beta1 drivers
// are called through the upstream conversion wrapper, as the kubelet does.
type client interface {
	NodePrepareResources(context.Context, *drapbv1.NodePrepareResourcesRequest) (*drapbv1.NodePrepareResourcesResponse, error)
	NodeUnprepareResources(context.Context, *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error)
}

type v1Client struct{ c drapbv1.DRAPluginClient }

func (c v1Client) NodePrepareResources(ctx context.Context, req *drapbv1.NodePrepareResourcesRequest) (*drapbv1.NodePrepareResourcesResponse, error) {
	return c.c.NodePrepareResources(ctx, req)
}

func (c v1Client) NodeUnprepareResources(ctx context.Context, req *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error) {
	return c.c.NodeUnprepareResources(ctx, req)
}

type v1beta1Client struct {
	w drapbv1beta1.V1Beta1ClientWrapper
}

func (c v1beta1Client) NodePrepareResources(ctx context.Context, req *drapbv1.NodePrepareResourcesRequest) (*drapbv1.NodePrepareResourcesResponse, error) {
	return c.w.NodePrepareResources(ctx, req)
}

func (c v1beta1Client) NodeUnprepareResources(ctx context.Context, req *drapbv1.NodeUnprepareResourcesRequest) (*drapbv1.NodeUnprepareResourcesResponse, error) {
	return c.w.NodeUnprepareResources(ctx, req)
}

// clientFor returns the serving instance of driver and its client. A driver
// with no instance is errdefs.ErrUnavailable: its calls cannot be made
// until it registers.
func (r *Registry) clientFor(driver string) (Conn, client, error) {
	c, err := r.Serving(driver)
	if errors.Is(err, errdefs.ErrNotFound) {
		return Conn{}, nil, errdefs.WithReason(fmt.Errorf("DRA driver %s is not registered on this node: %w", bounds.Text(driver), errdefs.ErrUnavailable),
			errdefs.ReasonDRADriverNotRegistered, map[string]string{errdefs.MetaDriver: bounds.Text(driver)})
	}
	if err != nil {
		return Conn{}, nil, err
	}
	switch c.Service {
	case drapbv1.DRAPluginService:
		return c, v1Client{drapbv1.NewDRAPluginClient(c.ClientConn)}, nil
	case drapbv1beta1.DRAPluginService:
		return c, v1beta1Client{drapbv1beta1.V1Beta1ClientWrapper{DRAPluginClient: drapbv1beta1.NewDRAPluginClient(c.ClientConn)}}, nil
	default:
		return Conn{}, nil, fmt.Errorf("DRA driver %s: unsupported DRA service %q: %w", bounds.Text(driver), c.Service, errdefs.ErrInternal)
	}
}

func claimsRequest(refs []claims.ClaimRef) []*drapbv1.Claim {
	out := make([]*drapbv1.Claim, len(refs))
	for i, c := range refs {
		out[i] = &drapbv1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID}
	}
	return out
}

// callError describes a failed call as a whole, the driver named first:
// the driver's gRPC status becomes the matching errdefs kind (an
// unreachable driver is unavailable), and the error carries the reason
// (errdefs.ReasonDRADriverUnreachable, or ReasonDRADriverFailed for any
// other failure) with the driver, its socket and the call, so that the
// caller learns that the driver, not the dramanager, is at fault.
func callError(method string, c Conn, err error) error {
	err = errdefs.FromGRPC(err)
	reason := errdefs.ReasonDRADriverFailed
	if errors.Is(err, errdefs.ErrUnavailable) {
		reason = errdefs.ReasonDRADriverUnreachable
	}
	return errdefs.WithReason(
		fmt.Errorf("DRA driver %s (socket %s): %s: %w", bounds.Text(c.Driver), bounds.Quote(c.Endpoint), method, err),
		reason, map[string]string{errdefs.MetaDriver: bounds.Text(c.Driver), errdefs.MetaSocket: bounds.Text(c.Endpoint), errdefs.MetaCall: method})
}

// Prepare calls NodePrepareResources of driver's serving instance (within
// CallTimeout) and returns each claim's devices or the driver's error for
// it, by claim UID. A claim the driver did not answer for is an error for
// that claim.
func (r *Registry) Prepare(ctx context.Context, driver string, refs []claims.ClaimRef) (map[string]claims.PrepareResult, error) {
	conn, cl, err := r.clientFor(driver)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	resp, err := cl.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: claimsRequest(refs)})
	if err != nil {
		return nil, callError("NodePrepareResources", conn, err)
	}
	out := make(map[string]claims.PrepareResult, len(refs))
	for _, ref := range refs {
		res, ok := resp.GetClaims()[ref.UID]
		switch {
		case !ok || res == nil:
			out[ref.UID] = claims.PrepareResult{Err: fmt.Errorf("DRA driver %s returned no result for claim %s/%s (UID %s) from NodePrepareResources",
				bounds.Text(driver), ref.Namespace, ref.Name, ref.UID)}
		case res.GetError() != "":
			out[ref.UID] = claims.PrepareResult{Err: fmt.Errorf("DRA driver %s failed to prepare claim %s/%s (UID %s): %s",
				bounds.Text(driver), ref.Namespace, ref.Name, ref.UID, res.GetError())}
		default:
			devs := make([]claims.Device, 0, len(res.GetDevices()))
			for _, d := range res.GetDevices() {
				devs = append(devs, claims.Device{
					Requests: slices.Clone(d.GetRequestNames()), Driver: driver, Pool: d.GetPoolName(), Device: d.GetDeviceName(),
					CDIDeviceIDs: slices.Clone(d.GetCdiDeviceIds()),
				})
			}
			out[ref.UID] = claims.PrepareResult{Devices: devs}
		}
	}
	return out, nil
}

// Unprepare calls NodeUnprepareResources of driver's serving instance
// (within CallTimeout) and returns the driver's error for each claim that
// failed, by claim UID (nil for those that succeeded). A claim the driver
// did not answer for is an error for that claim.
func (r *Registry) Unprepare(ctx context.Context, driver string, refs []claims.ClaimRef) (map[string]error, error) {
	conn, cl, err := r.clientFor(driver)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	resp, err := cl.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: claimsRequest(refs)})
	if err != nil {
		return nil, callError("NodeUnprepareResources", conn, err)
	}
	out := make(map[string]error, len(refs))
	for _, ref := range refs {
		res, ok := resp.GetClaims()[ref.UID]
		switch {
		case !ok || res == nil:
			out[ref.UID] = fmt.Errorf("DRA driver %s returned no result for claim %s/%s (UID %s) from NodeUnprepareResources",
				bounds.Text(driver), ref.Namespace, ref.Name, ref.UID)
		case res.GetError() != "":
			out[ref.UID] = fmt.Errorf("DRA driver %s failed to unprepare claim %s/%s (UID %s): %s",
				bounds.Text(driver), ref.Namespace, ref.Name, ref.UID, res.GetError())
		default:
			out[ref.UID] = nil
		}
	}
	return out, nil
}
