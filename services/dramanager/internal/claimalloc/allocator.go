// Package claimalloc reserves DRA ResourceClaims for pods on this node: it
// does the one-node part of the scheduler's job with the scheduler's own
// allocator (k8s.io/dynamic-resource-allocation/structured) against this
// node's ResourceSlices and the DeviceClasses, writes status.allocation and
// status.reservedFor, and undoes both on Unreserve.
//
// A claim this node allocated carries the annotation AllocatedByAnnotation
// with the node's name; only such a claim is deallocated when its last pod
// goes. A claim someone else allocated (a scheduler, in a cluster) is used as
// it is and never deallocated here.
//
// Run, for the service's life, follows the claims, slices, classes and the
// Node with informers, so that a decision reads them from memory; without
// it each decision lists them from the API.
package claimalloc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubecache"
)

// AllocatedByAnnotation marks a claim this node allocated; its value is the
// node's name. It is written before the allocation (so that an allocation of
// ours is never left unmarked) and removed after the deallocation. A marker
// without an allocation is harmless: the next allocation here rewrites it and
// Unreserve removes it.
const AllocatedByAnnotation = "nodeplug.io/allocated-by-node"

// maxAttempts bounds the re-reads after a 409 (a concurrent writer of the
// same claim) in one call.
const maxAttempts = 10

// unmarkTimeout bounds the clean-up after a failed allocation write.
const unmarkTimeout = 5 * time.Second

// features are the allocator features enabled: those of the DRA feature
// gates that are on by default and need nothing but the claim, the slices
// and the classes (binding conditions need a controller that fulfils them,
// which a node alone does not have).
var features = structured.Features{
	AdminAccess:             true,
	PrioritizedList:         true,
	PartitionableDevices:    true,
	DeviceTaints:            true,
	ConsumableCapacity:      true,
	FractionalCapacityRange: true,
}

// Allocator implements claims.Reserver over a Kubernetes API (the node-local
// one, or a cluster's) for one node. It is safe for concurrent use: the
// decisions "take the devices in use, allocate" are serialized, and a
// decision's devices are in use from then on (pending until its write's
// outcome is known, then as written), so two claims reserved at once never
// get the same device — provided nothing else allocates on this node at the
// same time (on the node-local API nothing does; in a cluster the scheduler
// allocates claims before they reach a node, and those arrive here already
// allocated). The writes themselves run in parallel. Unreserve is not
// serialized with them: freeing devices cannot give one to two claims, and
// writes of one claim are kept apart by its resourceVersion (409, read
// again).
//
// The devices in use are those of the claims as last seen: listed from the
// API for each decision, or, while Run runs, followed by an informer; either
// way this Allocator's own writes count as soon as they are made.
type Allocator struct {
	client kubernetes.Interface
	node   string
	log    *slog.Logger
	// who is named in the API's refusals (SetIdentity).
	who      *kubeaccess.Identity
	celCache *cel.Cache
	track    *tracker

	// kc, when set (Follow), are the informers Run reads.
	kc *kubecache.Cache
	// taintRules: decisions apply the API's DeviceTaintRules.
	taintRules bool
	// cached is set while Run's informers are synced.
	cached  atomic.Pointer[caches]
	running atomic.Bool
	// fromAPI counts the decisions made again from the API.
	fromAPI atomic.Int64

	// mu serializes allocation decisions.
	mu sync.Mutex
}

var _ claims.Reserver = (*Allocator)(nil)

// New returns an Allocator for nodeName reaching the API through client.
func New(client kubernetes.Interface, nodeName string, log *slog.Logger) (*Allocator, error) {
	if client == nil {
		return nil, fmt.Errorf("claim allocation: no Kubernetes client: %w", errdefs.ErrInvalidArgument)
	}
	if nodeName == "" {
		return nil, fmt.Errorf("claim allocation: no node name: %w", errdefs.ErrInvalidArgument)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Allocator{
		client: client, node: nodeName, log: log.With("node", nodeName),
		celCache: cel.NewCache(100, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity}),
		track:    newTracker(),
	}, nil
}

// SetIdentity names who as the identity the API refuses, in the
// PERMISSION_DENIED errors of a 401 or a 422 (whose answers do not name
// it); called before the first Reserve.
func (a *Allocator) SetIdentity(who *kubeaccess.Identity) { a.who = who }

// Reserve implements claims.Reserver.
func (a *Allocator) Reserve(ctx context.Context, pod claims.PodRef, ref claims.ClaimRef) (*resourcev1.ResourceClaim, error) {
	if err := checkRefs(pod, ref); err != nil {
		return nil, err
	}
	for attempt := 1; ; attempt++ {
		claim, err := a.getClaim(ctx, ref)
		if err != nil {
			return nil, err
		}
		if ref.UID != "" && string(claim.UID) != ref.UID {
			return nil, fmt.Errorf("claim %s has UID %s, not %s (it was recreated): %w", name(ref), claim.UID, ref.UID, errdefs.ErrFailedPrecondition)
		}
		if claim.DeletionTimestamp != nil {
			return nil, fmt.Errorf("claim %s is being deleted: %w", name(ref), errdefs.ErrFailedPrecondition)
		}
		var out *resourcev1.ResourceClaim
		if claim.Status.Allocation == nil {
			out, err = a.allocate(ctx, pod, claim)
		} else {
			out, err = a.reserveAllocated(ctx, pod, claim)
		}
		if apierrors.IsConflict(err) && attempt < maxAttempts {
			a.log.Debug("claim changed while reserving it; reading it again", "claim", name(ref), "attempt", attempt)
			continue
		}
		if err != nil {
			return nil, a.apiError(fmt.Sprintf("reserving claim %s for pod %s", name(ref), pod.UID), err)
		}
		return out, nil
	}
}

// allocate allocates an unallocated claim on this node and reserves it for
// pod. The marker goes first (an Update: it is metadata), then allocation and
// reservation in one status write.
func (a *Allocator) allocate(ctx context.Context, pod claims.PodRef, claim *resourcev1.ResourceClaim) (out *resourcev1.ResourceClaim, err error) {
	result, written, err := a.decide(ctx, claim)
	if err != nil {
		return nil, err
	}
	defer func() { written(out) }()
	if claim.Annotations[AllocatedByAnnotation] != a.node {
		claim = claim.DeepCopy()
		if claim.Annotations == nil {
			claim.Annotations = map[string]string{}
		}
		claim.Annotations[AllocatedByAnnotation] = a.node
		claim, err = a.client.ResourceV1().ResourceClaims(claim.Namespace).Update(ctx, claim, metav1.UpdateOptions{})
		if err != nil {
			return nil, err
		}
		claims.Crash(claims.CrashMarked)
	}
	claim = claim.DeepCopy()
	claim.Status.Allocation = result
	claim.Status.ReservedFor = append(claim.Status.ReservedFor, consumer(pod))
	out, err = a.client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		if !apierrors.IsConflict(err) { // a conflict is read again and retried
			a.unmark(ctx, claim)
		}
		return nil, err
	}
	a.log.Info("allocated claim", "claim", objName(out), "pod", pod.UID, "devices", deviceNames(out.Status.Allocation))
	claims.Crash(claims.CrashAllocated)
	return out, nil
}

// errFromAPI asks decide to decide again from the API's state.
var errFromAPI = errors.New("no allocation in the informers' view")

// decide finds an allocation for claim, its devices in use from then on;
// written notes the outcome of its write (the claim as written, nil when the
// write failed). It decides from the informers' stores while Run runs, and
// from the API when they find none (or Run does not run): what they miss
// (a slice just published, a deallocation not yet seen) fails no claim.
func (a *Allocator) decide(ctx context.Context, claim *resourcev1.ResourceClaim) (*resourcev1.AllocationResult, func(*resourcev1.ResourceClaim), error) {
	if c := a.cached.Load(); c != nil {
		in, err := a.cachedInputs(ctx, c)
		if err != nil {
			return nil, nil, err
		}
		result, written, err := a.decideWith(ctx, claim, in, true)
		if !errors.Is(err, errFromAPI) {
			return result, written, err
		}
		a.fromAPI.Add(1)
		a.log.Debug("no allocation from the informers' view; reading the API", "claim", objName(claim))
	}
	in, err := a.readInputs(ctx)
	if err != nil {
		return nil, nil, err
	}
	return a.decideWith(ctx, claim, in, false)
}

// decideWith decides with the node, slices and classes of in and the
// tracker's devices in use. A claim with an allocation pending (another
// Reserve's) or with a newer version known is read again (a conflict),
// after the pending write.
func (a *Allocator) decideWith(ctx context.Context, claim *resourcev1.ResourceClaim, in *inputs, cached bool) (*resourcev1.AllocationResult, func(*resourcev1.ResourceClaim), error) {
	again := apierrors.NewConflict(resourcev1.Resource("resourceclaims"), objName(claim), errors.New("being allocated by another call"))
	a.mu.Lock()
	if wait := a.track.pendingFor(claim.UID); wait != nil {
		a.mu.Unlock()
		select {
		case <-wait:
			return nil, nil, again
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("claim %s: waiting for its allocation by another call: %w", objName(claim), ctx.Err())
		}
	}
	defer a.mu.Unlock()
	if a.track.knowsNewer(claim) {
		return nil, nil, again
	}
	in.state = a.track.state()
	alloc, err := structured.NewAllocator(ctx, features, in.state, in.classes, in.slices, a.celCache)
	if err != nil {
		return nil, nil, fmt.Errorf("claim %s: the allocator: %w", objName(claim), errdefs.ErrInternal)
	}
	results, err := alloc.Allocate(ctx, in.node, []*resourcev1.ResourceClaim{claim})
	switch {
	case err != nil && ctx.Err() != nil:
		return nil, nil, fmt.Errorf("claim %s: allocating: %w", objName(claim), ctx.Err())
	case (err != nil || len(results) != 1) && cached:
		return nil, nil, errFromAPI
	case err != nil:
		return nil, nil, fmt.Errorf("claim %s cannot be allocated on node %s: %s: %w", objName(claim), a.node, err.Error(), errdefs.ErrFailedPrecondition)
	case len(results) != 1:
		return nil, nil, fmt.Errorf("claim %s cannot be allocated on node %s: %s: %w",
			objName(claim), a.node, a.explain(ctx, claim, in), errdefs.ErrFailedPrecondition)
	}
	return &results[0], a.track.assume(claim.UID, &results[0]), nil
}

// reserveAllocated reserves a claim that is already allocated: it must be
// available on this node; the pod is added to reservedFor if missing.
func (a *Allocator) reserveAllocated(ctx context.Context, pod claims.PodRef, claim *resourcev1.ResourceClaim) (*resourcev1.ResourceClaim, error) {
	a.track.observe(claim) // its devices are in use here before the informer shows them
	if sel := claim.Status.Allocation.NodeSelector; sel != nil {
		node, err := a.nodeObj(ctx)
		if err != nil {
			return nil, err
		}
		ok, err := structured.NodeMatches(features, node, "", false, sel)
		if err != nil {
			return nil, fmt.Errorf("claim %s: its allocation's node selector: %s: %w", objName(claim), err.Error(), errdefs.ErrFailedPrecondition)
		}
		if !ok {
			return nil, fmt.Errorf("claim %s is allocated to %s, not to this node %s: %w",
				objName(claim), selectedNodes(sel), a.node, errdefs.ErrFailedPrecondition)
		}
	}
	if reservedBy(claim, pod.UID) {
		return claim, nil
	}
	if len(claim.Status.ReservedFor) >= resourcev1.ResourceClaimReservedForMaxSize {
		return nil, fmt.Errorf("claim %s is reserved for %d consumers, the most it can be: %w",
			objName(claim), len(claim.Status.ReservedFor), errdefs.ErrFailedPrecondition)
	}
	claim = claim.DeepCopy()
	claim.Status.ReservedFor = append(claim.Status.ReservedFor, consumer(pod))
	out, err := a.client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
	if err != nil {
		return nil, err
	}
	a.track.observe(out)
	a.log.Debug("reserved claim", "claim", objName(out), "pod", pod.UID)
	return out, nil
}

// Unreserve implements claims.Reserver.
func (a *Allocator) Unreserve(ctx context.Context, pod claims.PodRef, ref claims.ClaimRef) error {
	if err := checkRefs(pod, ref); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		err := a.unreserve(ctx, pod, ref)
		if apierrors.IsConflict(err) && attempt < maxAttempts {
			continue
		}
		if err != nil {
			if errors.Is(err, errGone) {
				return nil
			}
			return a.apiError(fmt.Sprintf("unreserving claim %s for pod %s", name(ref), pod.UID), err)
		}
		return nil
	}
}

var errGone = errors.New("claim gone")

func (a *Allocator) unreserve(ctx context.Context, pod claims.PodRef, ref claims.ClaimRef) error {
	claim, err := a.client.ResourceV1().ResourceClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && ref.UID != "" && string(claim.UID) != ref.UID) {
		return errGone
	}
	if err != nil {
		return err
	}
	ours := claim.Annotations[AllocatedByAnnotation] == a.node
	i := slices.IndexFunc(claim.Status.ReservedFor, func(c resourcev1.ResourceClaimConsumerReference) bool {
		return isPod(c) && string(c.UID) == pod.UID
	})
	if i >= 0 || (ours && claim.Status.Allocation != nil && len(claim.Status.ReservedFor) == 0) {
		claim = claim.DeepCopy()
		if i >= 0 {
			claim.Status.ReservedFor = slices.Delete(claim.Status.ReservedFor, i, i+1)
		}
		if ours && len(claim.Status.ReservedFor) == 0 {
			// The per-device status belongs to the allocation; the API
			// refuses it without one.
			claim.Status.Allocation, claim.Status.Devices = nil, nil
		}
		if claim, err = a.client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
			return err
		}
		a.track.observe(claim)
		if ours && claim.Status.Allocation == nil {
			a.log.Info("deallocated claim", "claim", objName(claim), "pod", pod.UID)
		}
	}
	if ours && claim.Status.Allocation == nil {
		claim = claim.DeepCopy()
		delete(claim.Annotations, AllocatedByAnnotation)
		if claim, err = a.client.ResourceV1().ResourceClaims(claim.Namespace).Update(ctx, claim, metav1.UpdateOptions{}); err != nil {
			return err
		}
		a.track.observe(claim)
	}
	return nil
}

// unmark removes the marker from a claim whose allocation was not written,
// best effort (a marker left without an allocation is harmless).
func (a *Allocator) unmark(ctx context.Context, claim *resourcev1.ResourceClaim) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unmarkTimeout)
	defer cancel()
	c, err := a.client.ResourceV1().ResourceClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil || c.UID != claim.UID || c.Status.Allocation != nil || c.Annotations[AllocatedByAnnotation] != a.node {
		return
	}
	delete(c.Annotations, AllocatedByAnnotation)
	if _, err := a.client.ResourceV1().ResourceClaims(c.Namespace).Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		a.log.Warn("claim keeps the allocation marker without an allocation", "claim", objName(c), "error", err)
	}
}

func (a *Allocator) getClaim(ctx context.Context, ref claims.ClaimRef) (*resourcev1.ResourceClaim, error) {
	claim, err := a.client.ResourceV1().ResourceClaims(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err != nil {
		return nil, a.apiError("reading claim "+name(ref), err)
	}
	return claim, nil
}

// apiError wraps an API error in the errdefs sentinel for its kind: a
// permission refused (403, 401, a 422 for want of resourceclaims/binding)
// is PERMISSION_DENIED naming the verb, the resource and the identity
// refused (kubeaccess.Denied). Errors already wrapping a sentinel or the
// context's error pass through.
func (a *Allocator) apiError(what string, err error) error {
	for _, s := range []error{errdefs.ErrNotFound, errdefs.ErrFailedPrecondition, errdefs.ErrInvalidArgument,
		errdefs.ErrPermissionDenied, errdefs.ErrUnavailable, errdefs.ErrInternal, context.Canceled, context.DeadlineExceeded} {
		if errors.Is(err, s) {
			return err
		}
	}
	if denied := kubeaccess.Denied(err, a.who); denied != nil {
		return fmt.Errorf("%s: %w", what, denied)
	}
	var kind error
	switch {
	case apierrors.IsNotFound(err):
		kind = errdefs.ErrNotFound
	case apierrors.IsConflict(err):
		kind = errdefs.ErrUnavailable // still conflicting after the re-reads: retryable
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err):
		kind = errdefs.ErrFailedPrecondition
	default:
		kind = errdefs.ErrUnavailable // unreachable, timeouts, 5xx, 429
	}
	return fmt.Errorf("%s: %s: %w", what, err.Error(), kind)
}

func checkRefs(pod claims.PodRef, ref claims.ClaimRef) error {
	if pod.UID == "" {
		return fmt.Errorf("claim %s: no pod UID: %w", name(ref), errdefs.ErrInvalidArgument)
	}
	if ref.Namespace == "" || ref.Name == "" {
		return fmt.Errorf("claim %q: namespace and name are required: %w", name(ref), errdefs.ErrInvalidArgument)
	}
	return nil
}

func consumer(pod claims.PodRef) resourcev1.ResourceClaimConsumerReference {
	return resourcev1.ResourceClaimConsumerReference{Resource: "pods", Name: pod.Name, UID: types.UID(pod.UID)}
}

func isPod(c resourcev1.ResourceClaimConsumerReference) bool {
	return c.APIGroup == "" && c.Resource == "pods"
}

func reservedBy(claim *resourcev1.ResourceClaim, podUID string) bool {
	return slices.ContainsFunc(claim.Status.ReservedFor, func(c resourcev1.ResourceClaimConsumerReference) bool {
		return isPod(c) && string(c.UID) == podUID
	})
}

func name(ref claims.ClaimRef) string { return ref.Namespace + "/" + ref.Name }

func objName(c *resourcev1.ResourceClaim) string { return c.Namespace + "/" + c.Name }

func deviceNames(alloc *resourcev1.AllocationResult) []string {
	var out []string
	for _, r := range alloc.Devices.Results {
		out = append(out, r.Driver+"/"+r.Pool+"/"+r.Device)
	}
	return out
}

// selectedNodes describes the nodes a node selector picks: the names it
// matches by metadata.name or the host name label, else the selector.
func selectedNodes(sel *corev1.NodeSelector) string {
	var names []string
	for _, t := range sel.NodeSelectorTerms {
		for _, f := range t.MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpIn {
				names = append(names, f.Values...)
			}
		}
		for _, e := range t.MatchExpressions {
			if e.Key == corev1.LabelHostname && e.Operator == corev1.NodeSelectorOpIn {
				names = append(names, e.Values...)
			}
		}
	}
	switch len(names) {
	case 0:
		return fmt.Sprintf("the nodes selected by %v", sel.NodeSelectorTerms)
	case 1:
		return "node " + names[0]
	}
	return fmt.Sprintf("nodes %v", names)
}
