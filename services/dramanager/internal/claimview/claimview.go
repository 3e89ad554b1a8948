// Package claimview says where each ResourceClaim stands on this node, as
// ListClaims shows it, and which claims concern this node: the API's
// claims joined by UID with this node's records (package claims), the
// devices' health from the DRA drivers, and why the prepares of this
// node's pods failed for them. It wraps the claims manager's Prepare, to
// remember those failures per claim and pod, and its ReleasePod, to
// forget a released pod's. The gRPC adapter (draserver) only converts
// what it returns.
//
// A claim's state is the first that holds of: prepared or unpreparing
// (this node's record), failed (a pod not released since failed to get
// it prepared), pending or allocated (the claim's status). Each of these
// changes only with a prepare, a release, the work they leave (unprepares,
// rollbacks) or a change of the claim itself, so the same history gives
// the same state once that work is done.
//
// Safe for concurrent use. A pod's Prepare and ReleasePod calls are
// serialised, so what is remembered of a pod follows the order in which
// the claims manager did them.
package claimview

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
	"github.com/nodeplug/nodeplug/services/internal/keylock"
)

// State is where a claim stands on this node.
type State int

// The states, as ListClaims names them; State says which one holds.
const (
	Pending     State = iota + 1 // not allocated, no failed prepare here
	Allocated                    // allocated, not prepared here
	Prepared                     // prepared here for its pods
	Unpreparing                  // NodeUnprepareResources is owed
	Failed                       // a prepare for a pod still here failed (Reason)
)

// Claim is one claim as this node sees it.
type Claim struct {
	Namespace, Name, UID string
	ResourceVersion      string
	Created              time.Time
	// AllocatedHere: this node allocated it.
	AllocatedHere bool
	// AllocatedNode is the node its allocation names ("" when none or
	// not a single node).
	AllocatedNode string
	Pods          []Pod
	Devices       []Device
	// CDIDeviceIDs are its devices' CDI IDs, each once.
	CDIDeviceIDs []string
	State        State
	Reason       string
}

// Pod is a pod the claim is reserved for or prepared for.
type Pod struct{ UID, Name string }

// Device is one of its devices, with its health.
type Device struct {
	Requests              []string
	Driver, Pool, Device  string
	CDIDeviceIDs          []string
	Health, HealthMessage string
}

// Records is what the view needs of the claims manager.
type Records interface {
	Prepare(ctx context.Context, req claims.PrepareRequest) ([]claims.ContainerResult, error)
	ReleasePod(ctx context.Context, podUID string) (int, error)
	Pods(podUID string) []claims.PodClaims
	List() []claims.Claim
}

// Health tells a device's health (the DRA registry); nil: unknown.
type Health interface {
	Health(driver, pool, device string) (health, message string)
}

// uidTimeout bounds the reads of the claims a failed prepare names.
const uidTimeout = 5 * time.Second

// View joins the API's claims with this node's records.
type View struct {
	client kubernetes.Interface
	node   string
	shared bool
	// identity names the dramanager on the API in refusals (WithIdentity).
	identity *kubeaccess.Identity
	records  Records
	health   Health
	pods     keylock.Mutex // by pod UID: its Prepare and ReleasePod
	failed   failures
}

// Option configures a View.
type Option func(*View)

// SharedAPI says whether the API is a cluster's, shared with other nodes.
// When it is, List leaves out, unless asked for all, the claims that do
// not concern this node (see ListOptions). The default, the node-local
// resource API, holds only this node's claims: every claim concerns it.
func SharedAPI(shared bool) Option { return func(v *View) { v.shared = shared } }

// WithIdentity names the dramanager's identity on the API in the errors of
// the requests it refuses (kubeaccess.Denied).
func WithIdentity(id *kubeaccess.Identity) Option { return func(v *View) { v.identity = id } }

// New returns the view of node's claims, read through client. With nil
// records the view shows the API's claims alone and Prepare and
// ReleasePod are unavailable.
func New(client kubernetes.Interface, node string, records Records, health Health, opts ...Option) *View {
	v := &View{client: client, node: node, records: records, health: health}
	for _, o := range opts {
		o(v)
	}
	return v
}

// Prepare prepares through the claims manager. When it fails (other than
// for a request that is itself wrong, which says nothing about its
// claims), each claim it names that is not prepared for the pod
// afterwards is remembered as failed for the pod, with the error; a claim
// prepared by the same call (the driver call that failed for another
// claim succeeded for it) is not failed. A claim the API does not have is
// not remembered: there is nothing to show it on, and a claim created
// later under its name never failed. When it succeeds, the pod's failures
// of its claims are forgotten.
func (v *View) Prepare(ctx context.Context, req claims.PrepareRequest) ([]claims.ContainerResult, error) {
	if v.records == nil {
		return nil, fmt.Errorf("this dramanager does not prepare ResourceClaims: %w", errdefs.ErrUnavailable)
	}
	unlock := v.pods.Lock(req.Pod.UID)
	defer unlock()
	res, err := v.records.Prepare(ctx, req)
	switch {
	case err == nil:
		for _, n := range claimNames(req) {
			v.failed.forget(req.Pod.Namespace+"/"+n, req.Pod.UID)
		}
		return res, nil
	case !errors.Is(err, errdefs.ErrInvalidArgument):
		v.remember(ctx, req, bounds.Text(err.Error()))
	}
	return nil, err
}

// remember records why as the failure of req's pod for each of its claims
// not prepared for the pod, against the claim's UID as the API has it now
// (the name alone when it cannot be read).
func (v *View) remember(ctx context.Context, req claims.PrepareRequest, why string) {
	ns, pod := req.Pod.Namespace, req.Pod.UID
	prepared := map[string]bool{}
	for _, c := range v.records.List() {
		if c.Ref.Namespace == ns && slices.Contains(c.Pods, pod) {
			prepared[c.Ref.Name] = true
		}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), uidTimeout)
	defer cancel()
	for _, n := range claimNames(req) {
		key := ns + "/" + n
		if prepared[n] {
			v.failed.forget(key, pod)
			continue
		}
		obj, err := v.client.ResourceV1().ResourceClaims(ns).Get(ctx, n, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			v.failed.forget(key, pod)
		case err != nil:
			v.failed.set(key, pod, "", why)
		default:
			v.failed.set(key, pod, string(obj.UID), why)
		}
	}
}

// ReleasePod releases the pod's claims through the claims manager and
// forgets its failed prepares, whether or not the release succeeded (the
// pod no longer waits for its claims; a failed release is retried by the
// caller).
func (v *View) ReleasePod(ctx context.Context, podUID string) (int, error) {
	if v.records == nil {
		return 0, fmt.Errorf("this dramanager does not prepare ResourceClaims: %w", errdefs.ErrUnavailable)
	}
	unlock := v.pods.Lock(podUID)
	defer unlock()
	n, err := v.records.ReleasePod(ctx, podUID)
	v.failed.forgetPod(podUID)
	return n, err
}

// Holds says whether the claims manager records the claim of that UID,
// prepared or still being unprepared.
func (v *View) Holds(claimUID string) bool {
	if v.records == nil {
		return false
	}
	for _, c := range v.records.List() {
		if c.Ref.UID == claimUID {
			return true
		}
	}
	return false
}

// Pods returns what the claims manager's Pods does (nil without one).
func (v *View) Pods(podUID string) []claims.PodClaims {
	if v.records == nil {
		return nil
	}
	return v.records.Pods(podUID)
}

func claimNames(req claims.PrepareRequest) []string {
	out := make([]string, 0, len(req.PodClaims))
	for _, pc := range req.PodClaims {
		out = append(out, pc.ResourceClaimName)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ListOptions selects the claims List returns.
type ListOptions struct {
	// Namespace: only this namespace's claims ("": every namespace's).
	Namespace string
	// All: also the claims that do not concern this node. A claim
	// concerns this node when its allocation's node selector names the
	// node, or the node allocated it (claimalloc.AllocatedByAnnotation, or
	// the record says so); when it is recorded here (prepared for pods, or
	// its unprepare owed); or when it is failed (a pod here failed to get
	// it prepared and was not released since). On the node-local resource
	// API (not SharedAPI) every claim concerns this node.
	All bool
}

// List returns the API's claims joined by UID with this node's records,
// then the records whose claim is no longer in the API, sorted by
// namespace, name and UID; unless opts.All, only those that concern this
// node. The failures of claims no longer in the API are forgotten.
func (v *View) List(ctx context.Context, opts ListOptions) ([]Claim, error) {
	since := v.failed.mark()
	list, err := v.client.ResourceV1().ResourceClaims(opts.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		if denied := kubeaccess.Denied(err, v.identity); denied != nil {
			return nil, fmt.Errorf("list ResourceClaims: %w", denied)
		}
		return nil, fmt.Errorf("list ResourceClaims: %w: %w", err, errdefs.ErrUnavailable)
	}
	records := map[string]claims.Claim{}
	if v.records != nil {
		for _, c := range v.records.List() {
			if opts.Namespace == "" || c.Ref.Namespace == opts.Namespace {
				records[c.Ref.UID] = c
			}
		}
	}
	listed := make(map[string]string, len(list.Items)) // namespace/name → UID
	out := make([]Claim, 0, len(list.Items)+len(records))
	for i := range list.Items {
		obj := &list.Items[i]
		listed[obj.Namespace+"/"+obj.Name] = string(obj.UID)
		rec, ok := records[string(obj.UID)]
		delete(records, string(obj.UID))
		var recp *claims.Claim
		if ok {
			recp = &rec
		}
		if c := v.claim(obj, recp); opts.All || v.concerns(&c, recp) {
			out = append(out, c)
		}
	}
	v.failed.prune(opts.Namespace, listed, since)
	for _, rec := range records { // recorded here: they concern this node
		c := v.claim(nil, &rec)
		c.Reason = joinReason("the claim is no longer in the API", c.Reason)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Claim) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return out, nil
}

// concerns says whether c (recorded here as rec, if at all) concerns this
// node (see ListOptions.All).
func (v *View) concerns(c *Claim, rec *claims.Claim) bool {
	return !v.shared || rec != nil || c.AllocatedHere || c.AllocatedNode == v.node || c.State == Failed
}

func joinReason(first, then string) string {
	if then == "" {
		return first
	}
	return first + "; " + then
}

// claim describes a claim from the API object obj and this node's record
// rec; either may be nil (not both).
func (v *View) claim(obj *resourcev1.ResourceClaim, rec *claims.Claim) Claim {
	var out Claim
	if obj != nil {
		out.Namespace, out.Name, out.UID = obj.Namespace, obj.Name, string(obj.UID)
		out.ResourceVersion, out.Created = obj.ResourceVersion, obj.CreationTimestamp.Time
		out.AllocatedHere = obj.Annotations[claimalloc.AllocatedByAnnotation] == v.node
		for _, r := range obj.Status.ReservedFor {
			if r.Resource == "pods" {
				out.Pods = append(out.Pods, Pod{UID: string(r.UID), Name: r.Name})
			}
		}
		if obj.Status.Allocation != nil {
			out.AllocatedNode = selectedNode(obj.Status.Allocation)
		}
	} else {
		out.Namespace, out.Name, out.UID = rec.Ref.Namespace, rec.Ref.Name, rec.Ref.UID
	}
	var devices []claims.Device
	switch {
	case rec != nil:
		devices = rec.Devices
		out.AllocatedHere = out.AllocatedHere || rec.AllocatedHere
		for _, p := range rec.Pods {
			if !slices.ContainsFunc(out.Pods, func(x Pod) bool { return x.UID == p }) {
				out.Pods = append(out.Pods, Pod{UID: p})
			}
		}
	case obj.Status.Allocation != nil:
		for _, r := range obj.Status.Allocation.Devices.Results {
			devices = append(devices, claims.Device{Requests: []string{r.Request}, Driver: r.Driver, Pool: r.Pool, Device: r.Device})
		}
	}
	v.addDevices(&out, devices)
	out.State, out.Reason = v.state(obj, rec, &out)
	return out
}

// addDevices adds devices, with their health, and their CDI IDs (each
// once) to c.
func (v *View) addDevices(c *Claim, devices []claims.Device) {
	for _, d := range devices {
		cd := Device{Requests: slices.Clone(d.Requests), Driver: d.Driver, Pool: d.Pool, Device: d.Device, CDIDeviceIDs: slices.Clone(d.CDIDeviceIDs)}
		if v.health != nil {
			cd.Health, cd.HealthMessage = v.health.Health(d.Driver, d.Pool, d.Device)
		}
		c.Devices = append(c.Devices, cd)
		for _, id := range d.CDIDeviceIDs {
			if !slices.Contains(c.CDIDeviceIDs, id) {
				c.CDIDeviceIDs = append(c.CDIDeviceIDs, id)
			}
		}
	}
}

// state says where a claim stands and why: the first of prepared or
// unpreparing (rec), failed (a failure of a pod not released since),
// pending or allocated (obj's status).
func (v *View) state(obj *resourcev1.ResourceClaim, rec *claims.Claim, c *Claim) (State, string) {
	switch {
	case rec != nil && rec.State == claims.StatePrepared:
		return Prepared, ""
	case rec != nil && rec.State == claims.StateUnpreparing:
		if rec.LastError != "" {
			return Unpreparing, "the last NodeUnprepareResources failed: " + rec.LastError
		}
		return Unpreparing, ""
	}
	if why, ok := v.failed.get(c.Namespace+"/"+c.Name, c.UID); ok {
		return Failed, why
	}
	if obj == nil || obj.Status.Allocation == nil {
		return Pending, ""
	}
	if c.AllocatedNode != "" && c.AllocatedNode != v.node {
		return Allocated, fmt.Sprintf("allocated to node %s, not this node (%s)", c.AllocatedNode, v.node)
	}
	return Allocated, ""
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
