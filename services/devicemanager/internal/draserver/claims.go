package draserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/claims"
)

// Claims is what the service needs of the claims manager (claims.Manager).
type Claims interface {
	Prepare(ctx context.Context, req claims.PrepareRequest) ([]claims.ContainerResult, error)
	List() []claims.Claim
}

// Option configures a Service.
type Option func(*Service)

// WithClaims serves PrepareResources and ListClaims with m; without it
// they are unavailable.
func WithClaims(m Claims) Option { return func(s *Service) { s.claims = m } }

// maxFailures bounds the failed prepares remembered for ListClaims.
const maxFailures = 1024

// failures remembers, per claim (namespace/name), why the last prepare
// naming it failed, until a prepare naming it succeeds.
type failures struct {
	mu sync.Mutex
	m  map[string]string
}

func (f *failures) set(keys []string, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]string{}
	}
	for _, k := range keys {
		if _, ok := f.m[k]; !ok && len(f.m) >= maxFailures {
			for old := range f.m { // forget any one to make room
				delete(f.m, old)
				break
			}
		}
		f.m[k] = why
	}
}

func (f *failures) clear(keys []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		delete(f.m, k)
	}
}

func (f *failures) get(key string) (string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	why, ok := f.m[key]
	return why, ok
}

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
		return nil, fmt.Errorf("this devicemanager does not prepare ResourceClaims: %w", errdefs.ErrUnavailable)
	}
	preq := prepareFromAPI(req)
	keys := make([]string, 0, len(preq.PodClaims))
	for _, pc := range preq.PodClaims {
		keys = append(keys, preq.Pod.Namespace+"/"+pc.ResourceClaimName)
	}
	res, err := s.claims.Prepare(ctx, preq)
	if err != nil {
		// A request that is wrong says nothing about its claims.
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			s.failed.set(keys, bounds.Text(err.Error()))
		}
		return nil, err
	}
	s.failed.clear(keys)
	out := &dmv1.PrepareResourcesResponse{InstanceId: s.instanceID}
	for _, c := range res {
		out.Containers = append(out.Containers, containerToAPI(c))
	}
	return out, nil
}

// ListClaims implements DRAService: the API's claims (of the namespace,
// when set) joined by UID with this node's records, then the records whose
// claim is no longer in the API.
func (s *Service) ListClaims(ctx context.Context, req *dmv1.ListClaimsRequest) (*dmv1.ListClaimsResponse, error) {
	list, err := s.slices.client.ResourceV1().ResourceClaims(req.GetNamespace()).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w: %w", err, errdefs.ErrUnavailable)
	}
	records := map[string]claims.Claim{}
	if s.claims != nil {
		for _, c := range s.claims.List() {
			if req.GetNamespace() == "" || c.Ref.Namespace == req.GetNamespace() {
				records[c.Ref.UID] = c
			}
		}
	}
	out := &dmv1.ListClaimsResponse{InstanceId: s.instanceID}
	for i := range list.Items {
		obj := &list.Items[i]
		rec, ok := records[string(obj.UID)]
		delete(records, string(obj.UID))
		var recp *claims.Claim
		if ok {
			recp = &rec
		}
		out.Claims = append(out.Claims, s.claimToAPI(obj, recp))
	}
	for _, rec := range records {
		c := s.claimToAPI(nil, &rec)
		if c.Reason == "" {
			c.Reason = "the claim is no longer in the API"
		} else {
			c.Reason = "the claim is no longer in the API; " + c.Reason
		}
		out.Claims = append(out.Claims, c)
	}
	slices.SortFunc(out.Claims, func(a, b *dmv1.Claim) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()), cmp.Compare(a.GetUid(), b.GetUid()))
	})
	return out, nil
}

// claimToAPI describes a claim from the API object obj and this node's
// record rec; either may be nil (not both).
func (s *Service) claimToAPI(obj *resourcev1.ResourceClaim, rec *claims.Claim) *dmv1.Claim {
	out := &dmv1.Claim{}
	if obj != nil {
		out.Namespace, out.Name, out.Uid = obj.Namespace, obj.Name, string(obj.UID)
		out.ResourceVersion, out.CreationTime = obj.ResourceVersion, timestamp(obj.CreationTimestamp.Time)
		out.AllocatedHere = obj.Annotations[claimalloc.AllocatedByAnnotation] == s.slices.node
		for _, r := range obj.Status.ReservedFor {
			if r.Resource == "pods" {
				out.Pods = append(out.Pods, &dmv1.ClaimPod{Uid: string(r.UID), Name: r.Name})
			}
		}
	} else {
		out.Namespace, out.Name, out.Uid = rec.Ref.Namespace, rec.Ref.Name, rec.Ref.UID
	}
	var devices []claims.Device
	switch {
	case rec != nil:
		devices = rec.Devices
		out.AllocatedHere = out.AllocatedHere || rec.AllocatedHere
		for _, p := range rec.Pods {
			if !slices.ContainsFunc(out.Pods, func(x *dmv1.ClaimPod) bool { return x.Uid == p }) {
				out.Pods = append(out.Pods, &dmv1.ClaimPod{Uid: p})
			}
		}
	case obj.Status.Allocation != nil:
		for _, r := range obj.Status.Allocation.Devices.Results {
			devices = append(devices, claims.Device{Requests: []string{r.Request}, Driver: r.Driver, Pool: r.Pool, Device: r.Device})
		}
	}
	for _, d := range devices {
		cd := &dmv1.ClaimDevice{Requests: slices.Clone(d.Requests), Driver: d.Driver, Pool: d.Pool, Device: d.Device, CdiDeviceIds: slices.Clone(d.CDIDeviceIDs)}
		if s.reg != nil {
			cd.Health, cd.HealthMessage = s.reg.Health(d.Driver, d.Pool, d.Device)
		}
		out.Devices = append(out.Devices, cd)
		for _, id := range d.CDIDeviceIDs {
			if !slices.Contains(out.CdiDeviceIds, id) {
				out.CdiDeviceIds = append(out.CdiDeviceIds, id)
			}
		}
	}
	if obj != nil && obj.Status.Allocation != nil {
		out.AllocatedNode = selectedNode(obj.Status.Allocation)
	}
	out.State, out.Reason = s.claimState(obj, rec, out)
	return out
}

// claimState says where a claim stands and why.
func (s *Service) claimState(obj *resourcev1.ResourceClaim, rec *claims.Claim, c *dmv1.Claim) (dmv1.ClaimState, string) {
	switch {
	case rec != nil && rec.State == claims.StatePrepared:
		return dmv1.ClaimState_CLAIM_STATE_PREPARED, ""
	case rec != nil && rec.State == claims.StateUnpreparing:
		if rec.LastError != "" {
			return dmv1.ClaimState_CLAIM_STATE_UNPREPARING, "the last NodeUnprepareResources failed: " + rec.LastError
		}
		return dmv1.ClaimState_CLAIM_STATE_UNPREPARING, ""
	}
	if why, ok := s.failed.get(c.Namespace + "/" + c.Name); ok {
		return dmv1.ClaimState_CLAIM_STATE_FAILED, why
	}
	if obj == nil || obj.Status.Allocation == nil {
		return dmv1.ClaimState_CLAIM_STATE_PENDING, ""
	}
	if c.AllocatedNode != "" && c.AllocatedNode != s.slices.node {
		return dmv1.ClaimState_CLAIM_STATE_ALLOCATED, fmt.Sprintf("allocated to node %s, not this node (%s)", c.AllocatedNode, s.slices.node)
	}
	return dmv1.ClaimState_CLAIM_STATE_ALLOCATED, ""
}

// selectedNode returns the node an allocation's node selector names with
// a single metadata.name (or hostname label) match, as the allocator writes
// it; "" otherwise.
func selectedNode(a *resourcev1.AllocationResult) string {
	if a.NodeSelector == nil || len(a.NodeSelector.NodeSelectorTerms) != 1 {
		return ""
	}
	t := a.NodeSelector.NodeSelectorTerms[0]
	for _, r := range t.MatchFields {
		if r.Key == "metadata.name" && r.Operator == "In" && len(r.Values) == 1 {
			return r.Values[0]
		}
	}
	for _, r := range t.MatchExpressions {
		if r.Key == "kubernetes.io/hostname" && r.Operator == "In" && len(r.Values) == 1 {
			return r.Values[0]
		}
	}
	return ""
}
