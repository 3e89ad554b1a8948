// Package draclient is the devicemanager's side of the DRA half: the DRA
// claims live in nodeplug-dramanager, another process, and the
// devicemanager asks it over DRAService for what its own calls need. A
// container start needs the CDI device IDs of the claims the container
// references (ListPodClaims of the pod). The pod resources API needs every
// pod's claim devices (ListPodClaims). A Release of a whole pod releases
// its claims too (ReleasePodClaims).
//
// An error of the dramanager keeps its code (errdefs) and names the
// dramanager and its address, so that a caller of the devicemanager sees
// which process failed.
package draclient

import (
	"context"
	"fmt"

	"google.golang.org/grpc"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// Client reaches the dramanager.
type Client struct {
	dra  dmv1.DRAServiceClient
	addr string
}

// New returns a Client over conn, a connection to the dramanager at addr
// (named in errors).
func New(conn grpc.ClientConnInterface, addr string) *Client {
	return &Client{dra: dmv1.NewDRAServiceClient(conn), addr: addr}
}

func (c *Client) wrap(call string, err error) error {
	return fmt.Errorf("nodeplug-dramanager at %s: %s: %w", c.addr, call, errdefs.FromGRPC(err))
}

// Container returns the CDI device IDs of the prepared claims container of
// pod references, and whether it references any.
func (c *Client) Container(ctx context.Context, pod, container string) ([]string, bool, error) {
	resp, err := c.dra.ListPodClaims(ctx, &dmv1.ListPodClaimsRequest{PodUid: pod})
	if err != nil {
		return nil, false, c.wrap("ListPodClaims", err)
	}
	for _, p := range resp.GetPods() {
		if p.GetPodUid() != pod {
			continue
		}
		for _, ctr := range p.GetContainers() {
			if ctr.GetName() == container {
				return ctr.GetCdiDeviceIds(), true, nil
			}
		}
	}
	return nil, false, nil
}

// Pods returns every pod that uses a prepared claim, with what each of its
// containers gets.
func (c *Client) Pods(ctx context.Context) ([]*dmv1.PodClaims, error) {
	resp, err := c.dra.ListPodClaims(ctx, &dmv1.ListPodClaimsRequest{})
	if err != nil {
		return nil, c.wrap("ListPodClaims", err)
	}
	return resp.GetPods(), nil
}

// ReleasePod releases pod's claims and returns how many it no longer
// uses.
func (c *Client) ReleasePod(ctx context.Context, pod string) (int, error) {
	resp, err := c.dra.ReleasePodClaims(ctx, &dmv1.ReleasePodClaimsRequest{PodUid: pod})
	if err != nil {
		return 0, c.wrap("ReleasePodClaims", err)
	}
	return int(resp.GetReleasedClaims()), nil
}
