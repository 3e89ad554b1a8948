package claimalloc

import (
	"context"
	"fmt"
	"slices"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
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
}

// nodeDevice is a device of a slice available on this node.
type nodeDevice struct {
	driver, pool string
	device       *resourcev1.Device
}

// explain says why the allocator found no allocation for claim (it returns
// no result and no error then): per request, its class and count, how many
// of the node's devices match the class's and the request's selectors and
// how many of those are free.
func (a *Allocator) explain(ctx context.Context, claim *resourcev1.ResourceClaim, in *inputs) string {
	devices := a.nodeDevices(in)
	if len(devices) == 0 {
		return "no ResourceSlice publishes devices available on this node"
	}
	var parts []string
	for _, r := range requestsOf(claim) {
		parts = append(parts, a.explainRequest(ctx, r, devices, in))
	}
	if len(claim.Spec.Devices.Constraints) > 0 {
		parts = append(parts, fmt.Sprintf("and the claim's %d constraint(s) must hold together", len(claim.Spec.Devices.Constraints)))
	}
	return strings.Join(parts, "; ")
}

func (a *Allocator) explainRequest(ctx context.Context, r request, devices []nodeDevice, in *inputs) string {
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
	matched, free, tainted := 0, 0, 0
	for _, d := range devices {
		ok, err := a.matches(ctx, d, selectors)
		if err != nil {
			return fmt.Sprintf("%s: device %s/%s/%s: %v", head, d.driver, d.pool, d.device.Name, err)
		}
		if !ok {
			continue
		}
		matched++
		id := structured.MakeDeviceID(d.driver, d.pool, d.device.Name)
		if r.admin || !in.state.AllocatedDevices.Has(id) {
			free++
		}
		if slices.ContainsFunc(d.device.Taints, func(t resourcev1.DeviceTaint) bool {
			return t.Effect == resourcev1.DeviceTaintEffectNoSchedule || t.Effect == resourcev1.DeviceTaintEffectNoExecute
		}) {
			tainted++
		}
	}
	out := fmt.Sprintf("%s: %d of the node's %d device(s) match the class's and the request's selectors, %d of them free",
		head, matched, len(devices), free)
	if tainted > 0 {
		out += fmt.Sprintf(", %d tainted (NoSchedule or NoExecute; the request must tolerate the taint)", tainted)
	}
	return out
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
// subrequest of a prioritized list ("<request>/<subrequest>").
func requestsOf(claim *resourcev1.ResourceClaim) []request {
	var out []request
	for _, r := range claim.Spec.Devices.Requests {
		if e := r.Exactly; e != nil {
			out = append(out, request{name: r.Name, class: e.DeviceClassName, selectors: e.Selectors,
				mode: e.AllocationMode, count: countOf(e.AllocationMode, e.Count), admin: ptr.Deref(e.AdminAccess, false)})
		}
		for _, s := range r.FirstAvailable {
			out = append(out, request{name: r.Name + "/" + s.Name, class: s.DeviceClassName, selectors: s.Selectors,
				mode: s.AllocationMode, count: countOf(s.AllocationMode, s.Count)})
		}
	}
	return out
}

// countOf is a request's count, defaulted as the API does (the count is
// not used in mode All).
func countOf(_ resourcev1.DeviceAllocationMode, count int64) int64 {
	if count == 0 {
		return 1
	}
	return count
}
