package claimalloc

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// request is one request or subrequest of a claim, as the explanation
// needs it.
type request struct {
	name      string
	class     string
	selectors []resourcev1.DeviceSelector
	mode      resourcev1.DeviceAllocationMode
	count     int64
	admin     bool
	capacity  *resourcev1.CapacityRequirements
}

// nodeDevice is a device of a slice available on this node.
type nodeDevice struct {
	driver, pool string
	device       *resourcev1.Device
}

// explain says why the allocator found no allocation for claim (it returns
// no result and no error then): per request, its class and count, how many
// of the node's devices match the class's and the request's selectors, how
// many of those are free, and of the free ones which a shared counter or
// a capacity leaves short (naming the counter set and counter, or the
// device and capacity); and the rule that refuses admin access.
func (a *Allocator) explain(ctx context.Context, claim *resourcev1.ResourceClaim, in *inputs) string {
	devices := a.nodeDevices(in)
	if len(devices) == 0 {
		return "no ResourceSlice publishes devices available on this node"
	}
	var parts []string
	if why := a.adminAccessRefusal(ctx, claim); why != "" {
		parts = append(parts, why)
	}
	lim := limitsOf(in)
	for _, r := range requestsOf(claim) {
		parts = append(parts, a.explainRequest(ctx, r, devices, in, lim))
	}
	if len(claim.Spec.Devices.Constraints) > 0 {
		parts = append(parts, fmt.Sprintf("and the claim's %d constraint(s) must hold together", len(claim.Spec.Devices.Constraints)))
	}
	return strings.Join(parts, "; ")
}

// tally is what explainRequest counts of the devices matching a request.
type tally struct {
	matched, free, tainted int
	// short are the free devices a shared counter or a capacity leaves
	// short, with the first reasons (distinct, at most maxReasons).
	short   int
	reasons []string
}

// maxReasons bounds the reasons an explanation lists per request.
const maxReasons = 3

func (t *tally) note(why string) {
	t.short++
	if len(t.reasons) < maxReasons && !slices.Contains(t.reasons, why) {
		t.reasons = append(t.reasons, why)
	}
}

func (a *Allocator) explainRequest(ctx context.Context, r request, devices []nodeDevice, in *inputs, lim *limits) string {
	want := fmt.Sprintf("%d device(s)", r.count)
	if r.mode == resourcev1.DeviceAllocationModeAll {
		want = "all matching devices"
	}
	if r.admin {
		want += " with admin access"
	}
	head := fmt.Sprintf("request %q (class %q, %s)", r.name, r.class, want)
	class, err := in.classes.Get(r.class)
	if err != nil {
		return fmt.Sprintf("%s: DeviceClass %q does not exist", head, r.class)
	}
	selectors := append(append([]resourcev1.DeviceSelector(nil), class.Spec.Selectors...), r.selectors...)
	var t tally
	for _, d := range devices {
		ok, err := a.matches(ctx, d, selectors)
		if err != nil {
			return fmt.Sprintf("%s: device %s/%s/%s: %v", head, d.driver, d.pool, d.device.Name, err)
		}
		if ok {
			t.add(r, d, in, lim)
		}
	}
	out := fmt.Sprintf("%s: %d of the node's %d device(s) match the class's and the request's selectors, %d of them free",
		head, t.matched, len(devices), t.free)
	if r.admin {
		out += " (with admin access a device in use counts as free, but not one this claim takes for another request)"
	}
	if t.short > 0 {
		out += fmt.Sprintf(", %d of the free ones left short: %s", t.short, strings.Join(t.reasons, "; "))
	}
	if t.tainted > 0 {
		out += fmt.Sprintf(", %d tainted (NoSchedule or NoExecute; the request must tolerate the taint)", t.tainted)
	}
	return out
}

// add counts a device that matches r: free when not in use (or r has
// admin access), then short when a shared counter or a capacity does not
// leave it enough for r.
func (t *tally) add(r request, d nodeDevice, in *inputs, lim *limits) {
	t.matched++
	if slices.ContainsFunc(d.device.Taints, func(t resourcev1.DeviceTaint) bool {
		return t.Effect == resourcev1.DeviceTaintEffectNoSchedule || t.Effect == resourcev1.DeviceTaintEffectNoExecute
	}) {
		t.tainted++
	}
	id := structured.MakeDeviceID(d.driver, d.pool, d.device.Name)
	if !r.admin && in.state.AllocatedDevices.Has(id) {
		return
	}
	t.free++
	if why := lim.counterShort(d); why != "" {
		t.note(why)
		return
	}
	if why := lim.capacityShort(r, d); why != "" {
		t.note(why)
	}
}

// matches evaluates the CEL selectors against a device, as the allocator
// does.
func (a *Allocator) matches(ctx context.Context, d nodeDevice, selectors []resourcev1.DeviceSelector) (bool, error) {
	for _, s := range selectors {
		if s.CEL == nil {
			continue
		}
		expr := a.celCache.GetOrCompile(s.CEL.Expression)
		if expr.Error != nil {
			return false, fmt.Errorf("selector %q: %v", s.CEL.Expression, expr.Error)
		}
		ok, _, err := expr.DeviceMatches(ctx, cel.Device{
			Driver: d.driver, AllowMultipleAllocations: d.device.AllowMultipleAllocations,
			Attributes: d.device.Attributes, Capacity: d.device.Capacity,
		})
		if err != nil {
			return false, fmt.Errorf("selector %q: %v", s.CEL.Expression, err)
		}
		if !ok {
			return false, nil
		}
	}
	return true, nil
}

// nodeDevices are the devices of the slices available on this node.
func (a *Allocator) nodeDevices(in *inputs) []nodeDevice {
	var out []nodeDevice
	for _, s := range in.slices {
		perDevice := ptr.Deref(s.Spec.PerDeviceNodeSelection, false)
		if !perDevice {
			ok, err := structured.NodeMatches(features, in.node, ptr.Deref(s.Spec.NodeName, ""), ptr.Deref(s.Spec.AllNodes, false), s.Spec.NodeSelector)
			if err != nil || !ok {
				continue
			}
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if perDevice {
				ok, err := structured.NodeMatches(features, in.node, ptr.Deref(d.NodeName, ""), ptr.Deref(d.AllNodes, false), d.NodeSelector)
				if err != nil || !ok {
					continue
				}
			}
			out = append(out, nodeDevice{driver: s.Spec.Driver, pool: s.Spec.Pool.Name, device: d})
		}
	}
	return out
}

// requestsOf flattens a claim's requests: an exact request, or each
// subrequest of a prioritized list ("<request>/<subrequest>"). A count of
// 0 is 1, as the API defaults it (mode All does not use it).
func requestsOf(claim *resourcev1.ResourceClaim) []request {
	var out []request
	for _, r := range claim.Spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			out = append(out, request{name: r.Name, class: e.DeviceClassName, selectors: e.Selectors,
				mode: e.AllocationMode, count: cmp.Or(e.Count, 1), admin: ptr.Deref(e.AdminAccess, false),
				capacity: e.Capacity})
		}
		for _, s := range r.FirstAvailable {
			out = append(out, request{name: r.Name + "/" + s.Name, class: s.DeviceClassName, selectors: s.Selectors,
				mode: s.AllocationMode, count: cmp.Or(s.Count, 1), capacity: s.Capacity})
		}
	}
	return out
}

// counterKey names one counter of a counter set of a driver's pool.
type counterKey struct{ driver, pool, set, counter string }

// limits is what the devices in use of a decision leave of the node's
// shared counters and of the devices' capacities, as the structured
// allocator reckons them: a counter set's counters less what allocated
// devices consume of them; a device's capacity less what the shares of
// it consume.
type limits struct {
	total, left map[counterKey]resource.Quantity
	consumed    structured.ConsumedCapacityCollection
	// shared are the devices with shares in use: a further share of one
	// consumes no counters again.
	shared sets.Set[structured.DeviceID]
}

func limitsOf(in *inputs) *limits {
	shared := sets.New[structured.DeviceID]()
	for s := range in.state.AllocatedSharedDeviceIDs {
		shared.Insert(s.GetDeviceID())
	}
	for id := range in.state.AggregatedCapacity {
		shared.Insert(id)
	}
	l := &limits{total: map[counterKey]resource.Quantity{}, left: map[counterKey]resource.Quantity{}, consumed: in.state.AggregatedCapacity, shared: shared}
	for _, s := range in.slices {
		for _, cs := range s.Spec.SharedCounters {
			for name, c := range cs.Counters {
				k := counterKey{s.Spec.Driver, s.Spec.Pool.Name, cs.Name, name}
				l.total[k], l.left[k] = c.Value.DeepCopy(), c.Value.DeepCopy()
			}
		}
	}
	for _, s := range in.slices {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			id := structured.MakeDeviceID(s.Spec.Driver, s.Spec.Pool.Name, d.Name)
			if !in.state.AllocatedDevices.Has(id) && !shared.Has(id) {
				continue
			}
			for _, use := range d.ConsumesCounters {
				for name, c := range use.Counters {
					k := counterKey{s.Spec.Driver, s.Spec.Pool.Name, use.CounterSet, name}
					if left, ok := l.left[k]; ok {
						left.Sub(c.Value)
						l.left[k] = left
					}
				}
			}
		}
	}
	return l
}

// counterShort names the first counter that does not leave device d what
// it consumes: its counter set, its pool, what is left of it and what d
// needs; "" when every counter does.
func (l *limits) counterShort(d nodeDevice) string {
	if ptr.Deref(d.device.AllowMultipleAllocations, false) && l.shared.Has(structured.MakeDeviceID(d.driver, d.pool, d.device.Name)) {
		return ""
	}
	for _, use := range d.device.ConsumesCounters {
		for _, name := range slices.Sorted(maps.Keys(use.Counters)) {
			k := counterKey{d.driver, d.pool, use.CounterSet, name}
			left, ok := l.left[k]
			need := use.Counters[name].Value
			if !ok {
				return fmt.Sprintf("device %s/%s/%s consumes counter %q of counter set %q, which pool %q does not publish",
					d.driver, d.pool, d.device.Name, name, use.CounterSet, d.pool)
			}
			if left.Cmp(need) < 0 {
				total := l.total[k]
				return fmt.Sprintf("shared counter set %q of pool %q has %s of counter %q left (of %s), a device needs %s",
					use.CounterSet, d.pool, nonNegative(left), name, total.String(), need.String())
			}
		}
	}
	return ""
}

// capacityShort names the first capacity of device d that cannot give r
// what it asks: one d lacks, one whose request policy refuses the amount,
// or one whose shares in use leave too little; "" when d can serve r.
func (l *limits) capacityShort(r request, d nodeDevice) string {
	id := structured.MakeDeviceID(d.driver, d.pool, d.device.Name)
	var asks map[resourcev1.QualifiedName]resource.Quantity
	if r.capacity != nil {
		asks = r.capacity.Requests
	}
	for _, name := range slices.Sorted(maps.Keys(asks)) {
		if _, ok := d.device.Capacity[name]; !ok {
			return fmt.Sprintf("device %s has no capacity %q", id, name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(d.device.Capacity)) {
		c := d.device.Capacity[name]
		asked, named := asks[name]
		need := capacityNeed(asked, named, c)
		if why := policyRefuses(need, c.RequestPolicy); why != "" {
			return fmt.Sprintf("capacity %q of device %s: %s %s", name, id, need.String(), why)
		}
		used := resource.Quantity{}
		if q := l.consumed[id][name]; q != nil {
			used = q.DeepCopy()
		}
		sum := used.DeepCopy()
		sum.Add(need)
		if sum.Cmp(c.Value) <= 0 {
			continue
		}
		out := fmt.Sprintf("capacity %q of device %s: %s of %s in use, the request needs %s", name, id, used.String(), c.Value.String(), need.String())
		if !named {
			out += " (it names no amount of it, so it takes the device's default, else all of it)"
		}
		return out
	}
	return ""
}

// capacityNeed is what a request takes of capacity c: the amount it names
// (named), raised to the policy's minimum, step or next valid value; else
// the policy's default, else all of c.
func capacityNeed(asked resource.Quantity, named bool, c resourcev1.DeviceCapacity) resource.Quantity {
	p := c.RequestPolicy
	switch {
	case !named && p != nil && p.Default != nil:
		return p.Default.DeepCopy()
	case !named:
		return c.Value.DeepCopy()
	case p == nil:
		return asked.DeepCopy()
	case p.ValidRange != nil && p.ValidRange.Min != nil:
		lo := p.ValidRange.Min
		if asked.Cmp(*lo) < 0 {
			return lo.DeepCopy()
		}
		if st := p.ValidRange.Step; st != nil && st.MilliValue() > 0 {
			steps := (asked.MilliValue() - lo.MilliValue() + st.MilliValue() - 1) / st.MilliValue()
			return *resource.NewMilliQuantity(lo.MilliValue()+steps*st.MilliValue(), asked.Format)
		}
	case len(p.ValidValues) > 0:
		for _, v := range p.ValidValues {
			if asked.Cmp(v) <= 0 {
				return v.DeepCopy()
			}
		}
	}
	return asked.DeepCopy()
}

// policyRefuses says why a capacity's request policy refuses amount: above
// its range's maximum, or above every valid value; "" when it does not.
func policyRefuses(amount resource.Quantity, p *resourcev1.CapacityRequestPolicy) string {
	switch {
	case p == nil:
	case p.ValidRange != nil && p.ValidRange.Max != nil && amount.Cmp(*p.ValidRange.Max) > 0:
		return "is above the most its request policy allows, " + p.ValidRange.Max.String()
	case p.ValidRange == nil && len(p.ValidValues) > 0 && amount.Cmp(p.ValidValues[len(p.ValidValues)-1]) > 0:
		return "is above every valid value of its request policy, the largest " + p.ValidValues[len(p.ValidValues)-1].String()
	}
	return ""
}

// nonNegative is q, or 0 when allocated devices consume more than the
// counter has (which the allocator takes as nothing left).
func nonNegative(q resource.Quantity) string {
	if q.Sign() < 0 {
		return "0"
	}
	return q.String()
}

// adminAccessRefusal says why claim may not have admin access to devices
// under upstream's rule: the claim's namespace must carry the label
// resource.kubernetes.io/admin-access=true (DRAAdminNamespaceLabelKey);
// "" when the claim asks for none, the label is there, or the namespace
// cannot be read (the node-local API serves no namespaces; a cluster's
// API server checks the label when the claim is created).
func (a *Allocator) adminAccessRefusal(ctx context.Context, claim *resourcev1.ResourceClaim) string {
	if !slices.ContainsFunc(requestsOf(claim), func(r request) bool { return r.admin }) {
		return ""
	}
	ns, err := a.client.CoreV1().Namespaces().Get(ctx, claim.Namespace, metav1.GetOptions{})
	if err != nil || ns.Labels[resourcev1.DRAAdminNamespaceLabelKey] == "true" {
		return ""
	}
	return fmt.Sprintf("admin access: namespace %q lacks the label %s=true, which admin access to devices requires",
		claim.Namespace, resourcev1.DRAAdminNamespaceLabelKey)
}
