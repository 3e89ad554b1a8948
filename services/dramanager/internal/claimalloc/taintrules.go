package claimalloc

import (
	"context"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// DeviceTaintRules taint devices from outside their slices, as a
// cluster's scheduler applies them (upstream's resourceslice tracker): a
// rule's taint is added to every device its selector matches (driver,
// pool and device name, each when set) before an allocation decision
// reads the slices. A taint of effect None is informational and changes
// nothing the allocator decides.

// FollowTaintRules makes allocation decisions apply the API's
// DeviceTaintRules (read from kc's informer while Run runs with one, else
// listed). It is called before Run; with the node-local API, whose
// DeviceTaintRules nobody else applies.
func (a *Allocator) FollowTaintRules() { a.taintRules = true }

// listTaintRules reads the rules from the API, nil when rules are not
// followed.
func (a *Allocator) listTaintRules(ctx context.Context) ([]*resourcev1.DeviceTaintRule, error) {
	if !a.taintRules {
		return nil, nil
	}
	if a.kc != nil && a.kc.TaintRules != nil && a.cached.Load() != nil {
		var out []*resourcev1.DeviceTaintRule
		for _, obj := range a.kc.TaintRules.GetStore().List() {
			if r, ok := obj.(*resourcev1.DeviceTaintRule); ok {
				out = append(out, r)
			}
		}
		return out, nil
	}
	list, err := a.client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, a.apiError("listing DeviceTaintRules", err)
	}
	out := make([]*resourcev1.DeviceTaintRule, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, &list.Items[i])
	}
	return out, nil
}

// applyTaintRules returns slices with the rules' taints added to the
// devices they select; a slice no rule touches is returned as it is, one
// that a rule touches is a copy.
func applyTaintRules(slices []*resourcev1.ResourceSlice, rules []*resourcev1.DeviceTaintRule) []*resourcev1.ResourceSlice {
	if len(rules) == 0 {
		return slices
	}
	out := make([]*resourcev1.ResourceSlice, len(slices))
	for i, s := range slices {
		out[i] = s
		copied := false
		for j := range s.Spec.Devices {
			for _, r := range rules {
				if !selects(r, s, s.Spec.Devices[j].Name) {
					continue
				}
				if !copied {
					out[i], copied = s.DeepCopy(), true
				}
				d := &out[i].Spec.Devices[j]
				t := r.Spec.Taint
				if t.TimeAdded == nil {
					t.TimeAdded = ptr.To(r.CreationTimestamp)
				}
				d.Taints = append(d.Taints, t)
			}
		}
	}
	return out
}

func selects(r *resourcev1.DeviceTaintRule, s *resourcev1.ResourceSlice, device string) bool {
	sel := r.Spec.DeviceSelector
	if sel == nil {
		return true
	}
	return (sel.Driver == nil || *sel.Driver == s.Spec.Driver) &&
		(sel.Pool == nil || *sel.Pool == s.Spec.Pool.Name) &&
		(sel.Device == nil || *sel.Device == device)
}

// DeviceKey names a device of the node: its driver, pool and name.
type DeviceKey struct{ Driver, Pool, Device string }

// NoExecuteTaints returns the NoExecute taints of the node's devices, the
// DeviceTaintRules applied when they are followed: what an eviction
// decision reads. It reads the informers' stores while Run runs, else the
// API.
func (a *Allocator) NoExecuteTaints(ctx context.Context) (map[DeviceKey][]resourcev1.DeviceTaint, error) {
	var slices []*resourcev1.ResourceSlice
	if c := a.cached.Load(); c != nil {
		for _, store := range []cache.Store{c.nodeSlices, c.otherSlices} {
			for _, obj := range store.List() {
				if s, ok := obj.(*resourcev1.ResourceSlice); ok {
					slices = append(slices, s)
				}
			}
		}
	} else {
		var err error
		if slices, err = a.listSlices(ctx); err != nil {
			return nil, err
		}
	}
	rules, err := a.listTaintRules(ctx)
	if err != nil {
		return nil, err
	}
	out := map[DeviceKey][]resourcev1.DeviceTaint{}
	for _, s := range applyTaintRules(slices, rules) {
		if n := ptr.Deref(s.Spec.NodeName, ""); n != "" && n != a.node {
			continue
		}
		for _, d := range s.Spec.Devices {
			for _, t := range d.Taints {
				if t.Effect == resourcev1.DeviceTaintEffectNoExecute {
					k := DeviceKey{Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Device: d.Name}
					out[k] = append(out[k], t)
				}
			}
		}
	}
	return out, nil
}
