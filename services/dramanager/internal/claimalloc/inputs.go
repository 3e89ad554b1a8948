package claimalloc

import (
	"context"
	"sort"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

// inputs is what one allocation decision reads: from the API, or from
// the informers' stores while Run runs. state, the devices in use, is the
// tracker's, taken under Allocator.mu.
type inputs struct {
	node    *corev1.Node
	slices  []*resourcev1.ResourceSlice
	classes classLister
	state   structured.AllocatedState
}

// readInputs reads the Node, the slices that may hold devices for it, the
// DeviceClasses and every claim (handed to the tracker, the devices in use
// being the tracker's).
func (a *Allocator) readInputs(ctx context.Context) (*inputs, error) {
	node, err := a.client.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{})
	if err != nil {
		return nil, a.apiError("reading node "+a.node, err)
	}
	slices, err := a.listSlices(ctx)
	if err != nil {
		return nil, err
	}
	classList, err := a.client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, a.apiError("listing DeviceClasses", err)
	}
	classes := classLister{}
	for i := range classList.Items {
		classes[classList.Items[i].Name] = &classList.Items[i]
	}
	claimList, err := a.client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, a.apiError("listing ResourceClaims", err)
	}
	a.track.reconcile(claimList.Items, claimList.ResourceVersion)
	rules, err := a.listTaintRules(ctx)
	if err != nil {
		return nil, err
	}
	return &inputs{node: node, slices: applyTaintRules(slices, rules), classes: classes}, nil
}

// listSlices lists this node's slices (spec.nodeName) and those not bound
// to one node by name (allNodes, a node selector, per-device node
// selection); the allocator keeps those that match the Node.
func (a *Allocator) listSlices(ctx context.Context) ([]*resourcev1.ResourceSlice, error) {
	var out []*resourcev1.ResourceSlice
	for _, node := range []string{a.node, ""} {
		sel := fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, node).String()
		list, err := a.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return nil, a.apiError("listing ResourceSlices ("+sel+")", err)
		}
		for i := range list.Items {
			s := &list.Items[i]
			// A server that ignores the selector for the empty value
			// returns other nodes' slices too: they cannot match.
			if n := ptr.Deref(s.Spec.NodeName, ""); n != "" && n != a.node {
				continue
			}
			out = append(out, s)
		}
	}
	seen := sets.New[string]()
	kept := out[:0]
	for _, s := range out {
		if !seen.Has(s.Name) {
			seen.Insert(s.Name)
			kept = append(kept, s)
		}
	}
	return kept, nil
}

// classLister is the DeviceClasses read for one decision.
type classLister map[string]*resourcev1.DeviceClass

func (l classLister) List() ([]*resourcev1.DeviceClass, error) {
	out := make([]*resourcev1.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (l classLister) Get(name string) (*resourcev1.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourcev1.Resource("deviceclasses"), name)
}

var _ structured.DeviceClassLister = classLister(nil)
