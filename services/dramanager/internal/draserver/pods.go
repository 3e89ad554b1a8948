package draserver

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

// Pods is what the service needs of the claims manager for the
// devicemanager's calls: the pods' prepared claims, and a pod's release.
type Pods interface {
	Pods(podUID string) []claims.PodClaims
	ReleasePod(ctx context.Context, podUID string) (int, error)
}

var _ Pods = (*claims.Manager)(nil)

// WithPods serves ListPodClaims and ReleasePodClaims with p; without it
// they are unavailable.
func WithPods(p Pods) Option { return func(s *Service) { s.pods = p } }

// ListPodClaims implements DRAService.
func (s *Service) ListPodClaims(_ context.Context, req *dmv1.ListPodClaimsRequest) (*dmv1.ListPodClaimsResponse, error) {
	if s.pods == nil {
		return nil, fmt.Errorf("this dramanager does not prepare ResourceClaims: %w", errdefs.ErrUnavailable)
	}
	out := &dmv1.ListPodClaimsResponse{InstanceId: s.instanceID}
	for _, pc := range s.pods.Pods(req.GetPodUid()) {
		p := &dmv1.PodClaims{PodUid: pc.Pod.UID, PodNamespace: pc.Pod.Namespace, PodName: pc.Pod.Name}
		for _, c := range pc.Containers {
			p.Containers = append(p.Containers, containerToAPI(c))
		}
		out.Pods = append(out.Pods, p)
	}
	slices.SortFunc(out.Pods, func(a, b *dmv1.PodClaims) int { return cmp.Compare(a.GetPodUid(), b.GetPodUid()) })
	return out, nil
}

// ReleasePodClaims implements DRAService.
func (s *Service) ReleasePodClaims(ctx context.Context, req *dmv1.ReleasePodClaimsRequest) (*dmv1.ReleasePodClaimsResponse, error) {
	if s.pods == nil {
		return nil, fmt.Errorf("this dramanager does not prepare ResourceClaims: %w", errdefs.ErrUnavailable)
	}
	if req.GetPodUid() == "" {
		return nil, fmt.Errorf("a pod_uid is required: %w", errdefs.ErrInvalidArgument)
	}
	n, err := s.pods.ReleasePod(ctx, req.GetPodUid())
	if err != nil {
		return nil, err
	}
	return &dmv1.ReleasePodClaimsResponse{InstanceId: s.instanceID, ReleasedClaims: int64(n)}, nil
}
