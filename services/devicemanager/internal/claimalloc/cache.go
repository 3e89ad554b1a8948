package claimalloc

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// caches are the informers' stores an allocation decision reads while Run
// runs: the Node, its slices (by spec.nodeName, and those of no one node),
// the DeviceClasses. The claims feed the tracker.
type caches struct {
	node, nodeSlices, otherSlices, classes cache.Store
}

var errRunning = errors.New("claim allocation: Run is already running")

// Run follows the claims, this node's ResourceSlices, the DeviceClasses and
// the Node until ctx ends. Once they are listed, allocation decisions read
// them from memory (and the devices in use from the claims followed plus
// the allocations made here); before that, and after ctx ends, each
// decision lists them from the API. A decision that finds no allocation in
// memory is made again from the API, so that a slice, class or
// deallocation not yet seen never fails a claim.
func (a *Allocator) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer a.running.Store(false)
	byField := func(sel fields.Selector) informers.SharedInformerOption {
		return informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = sel.String() })
	}
	all := informers.NewSharedInformerFactory(a.client, 0)
	nodeF := informers.NewSharedInformerFactoryWithOptions(a.client, 0, byField(fields.OneTermEqualSelector("metadata.name", a.node)))
	mineF := informers.NewSharedInformerFactoryWithOptions(a.client, 0,
		byField(fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, a.node)))
	otherF := informers.NewSharedInformerFactoryWithOptions(a.client, 0,
		byField(fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, "")))
	factories := []informers.SharedInformerFactory{all, nodeF, mineF, otherF}

	claimInf := all.Resource().V1().ResourceClaims().Informer()
	if err := claimInf.SetTransform(stripClaim); err != nil {
		return fmt.Errorf("claim allocation: the claim informer: %w", err)
	}
	if _, err := claimInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.observeObj(obj) },
		UpdateFunc: func(_, obj any) { a.observeObj(obj) },
		DeleteFunc: a.forgetObj,
	}); err != nil {
		return fmt.Errorf("claim allocation: the claim informer: %w", err)
	}
	infs := []cache.SharedIndexInformer{
		claimInf,
		nodeF.Core().V1().Nodes().Informer(),
		mineF.Resource().V1().ResourceSlices().Informer(),
		otherF.Resource().V1().ResourceSlices().Informer(),
		all.Resource().V1().DeviceClasses().Informer(),
	}
	for _, f := range factories {
		f.Start(ctx.Done())
	}
	defer func() {
		a.cached.Store(nil)
		for _, f := range factories {
			f.Shutdown()
		}
	}()
	synced := make([]cache.InformerSynced, len(infs))
	for i, inf := range infs {
		synced[i] = inf.HasSynced
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return nil
	}
	a.cached.Store(&caches{node: infs[1].GetStore(), nodeSlices: infs[2].GetStore(), otherSlices: infs[3].GetStore(), classes: infs[4].GetStore()})
	a.log.Debug("following claims, slices, classes and the node")
	<-ctx.Done()
	return nil
}

// stripClaim keeps of a claim what the devices in use need.
func stripClaim(obj any) (any, error) {
	c, ok := obj.(*resourcev1.ResourceClaim)
	if !ok {
		return obj, nil
	}
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: c.UID, ResourceVersion: c.ResourceVersion},
		Status:     resourcev1.ResourceClaimStatus{Allocation: c.Status.Allocation},
	}, nil
}

func (a *Allocator) observeObj(obj any) {
	if c, ok := obj.(*resourcev1.ResourceClaim); ok {
		a.track.observe(c)
	}
}

func (a *Allocator) forgetObj(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if c, ok := obj.(*resourcev1.ResourceClaim); ok {
		a.track.forget(c.UID)
	}
}

// cachedInputs are the inputs of a decision from the informers' stores
// (the Node read from the API when not there yet).
func (a *Allocator) cachedInputs(ctx context.Context, c *caches) (*inputs, error) {
	var node *corev1.Node
	if obj, ok, _ := c.node.GetByKey(a.node); ok {
		node, _ = obj.(*corev1.Node)
	}
	if node == nil {
		n, err := a.client.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{})
		if err != nil {
			return nil, apiError("reading node "+a.node, err)
		}
		node = n
	}
	var out []*resourcev1.ResourceSlice
	seen := sets.New[string]()
	for _, store := range []cache.Store{c.nodeSlices, c.otherSlices} {
		for _, obj := range store.List() {
			s, ok := obj.(*resourcev1.ResourceSlice)
			if !ok || seen.Has(s.Name) {
				continue
			}
			if n := ptr.Deref(s.Spec.NodeName, ""); n != "" && n != a.node {
				continue
			}
			seen.Insert(s.Name)
			out = append(out, s)
		}
	}
	classes := classLister{}
	for _, obj := range c.classes.List() {
		if dc, ok := obj.(*resourcev1.DeviceClass); ok {
			classes[dc.Name] = dc
		}
	}
	return &inputs{node: node, slices: out, classes: classes, state: a.track.state()}, nil
}
