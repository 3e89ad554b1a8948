// Package claimview says where each ResourceClaim stands on this node, as
// ListClaims shows it: the API's claims joined by UID with this node's
// records (package claims), the devices' health from the DRA drivers, and
// why the last prepare naming a claim failed. It wraps the claims
// manager's Prepare to remember those failures, until a prepare naming the
// claim succeeds. The gRPC adapter (draserver) only converts what it
// returns.
//
// Safe for concurrent use.
package claimview

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

// State is where a claim stands on this node.
type State int

// The states, as ListClaims names them.
const (
	Pending     State = iota + 1 // not allocated
	Allocated                    // allocated, not prepared here
	Prepared                     // prepared here for its pods
	Unpreparing                  // its last pod left; NodeUnprepareResources is owed
	Failed                       // the last prepare naming it failed (Reason)
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
	List() []claims.Claim
}

// Health tells a device's health (the DRA registry); nil: unknown.
type Health interface {
	Health(driver, pool, device string) (health, message string)
}

// View joins the API's claims with this node's records.
type View struct {
	client  kubernetes.Interface
	node    string
	records Records
	health  Health
	failed  failures
}

// New returns the view of node's claims, read through client. With nil
// records the view shows the API's claims alone and Prepare is
// unavailable.
func New(client kubernetes.Interface, node string, records Records, health Health) *View {
	return &View{client: client, node: node, records: records, health: health}
}

// Prepare prepares through the claims manager and remembers why it failed
// for each claim it names (a request that is itself wrong says nothing
// about its claims), until a prepare naming the claim succeeds.
func (v *View) Prepare(ctx context.Context, req claims.PrepareRequest) ([]claims.ContainerResult, error) {
	if v.records == nil {
		return nil, fmt.Errorf("this dramanager does not prepare ResourceClaims: %w", errdefs.ErrUnavailable)
	}
	keys := make([]string, 0, len(req.PodClaims))
	for _, pc := range req.PodClaims {
		keys = append(keys, req.Pod.Namespace+"/"+pc.ResourceClaimName)
	}
	res, err := v.records.Prepare(ctx, req)
	if err != nil {
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			v.failed.set(keys, bounds.Text(err.Error()))
		}
		return nil, err
	}
	v.failed.clear(keys)
	return res, nil
}

// List returns the API's claims (of namespace, when set) joined by UID
// with this node's records, then the records whose claim is no longer in
// the API, sorted by namespace, name and UID.
func (v *View) List(ctx context.Context, namespace string) ([]Claim, error) {
	list, err := v.client.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w: %w", err, errdefs.ErrUnavailable)
	}
	records := map[string]claims.Claim{}
	if v.records != nil {
		for _, c := range v.records.List() {
			if namespace == "" || c.Ref.Namespace == namespace {
				records[c.Ref.UID] = c
			}
		}
	}
	out := make([]Claim, 0, len(list.Items)+len(records))
	for i := range list.Items {
		obj := &list.Items[i]
		rec, ok := records[string(obj.UID)]
		delete(records, string(obj.UID))
		var recp *claims.Claim
		if ok {
			recp = &rec
		}
		out = append(out, v.claim(obj, recp))
	}
	for _, rec := range records {
		c := v.claim(nil, &rec)
		c.Reason = joinReason("the claim is no longer in the API", c.Reason)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Claim) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return out, nil
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

// state says where a claim stands and why.
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
	if why, ok := v.failed.get(c.Namespace + "/" + c.Name); ok {
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

// maxFailures bounds the failed prepares remembered.
const maxFailures = 1024

// failures remembers, per claim (namespace/name), why the last prepare
// naming it failed.
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
