package claimalloc

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubecache"
)

// caches are the informers' stores an allocation decision reads while Run
// runs: the Node, its slices (by spec.nodeName, and those of no one node),
// the DeviceClasses. The claims feed the tracker.
type caches struct {
	node, nodeSlices, otherSlices, classes cache.Store
}

var errRunning = errors.New("claim allocation: Run is already running")

// Follow makes Run read kc's informers, shared with the dramanager's
// other readers of the API, instead of informers of its own. It is called
// before Run; kc is run by its owner.
func (a *Allocator) Follow(kc *kubecache.Cache) { a.kc = kc }

// Run follows the claims, this node's ResourceSlices, the DeviceClasses and
// the Node until ctx ends (through the informers given to Follow, or its
// own). Once they are listed, allocation decisions read them from memory
// (and the devices in use from the claims followed plus the allocations
// made here); before that, and after ctx ends, each decision lists them
// from the API. A decision that finds no allocation in memory is made
// again from the API, so that a slice, class or deallocation not yet seen
// never fails a claim.
func (a *Allocator) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return errRunning
	}
	defer a.running.Store(false)
	kc := a.kc
	if kc == nil {
		var err error
		var opts []kubecache.Option
		if a.taintRules {
			opts = append(opts, kubecache.WithTaintRules())
		}
		if kc, err = kubecache.New(a.client, a.node, opts...); err != nil {
			return fmt.Errorf("claim allocation: %w", err)
		}
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); _ = kc.Run(ctx) }()
		defer func() { cancel(); <-done }()
	}
	reg, err := kc.Claims.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.observeObj(obj) },
		UpdateFunc: func(_, obj any) { a.observeObj(obj) },
		DeleteFunc: a.forgetObj,
	})
	if err != nil {
		return fmt.Errorf("claim allocation: the claim informer: %w", err)
	}
	defer func() { _ = kc.Claims.RemoveEventHandler(reg) }()
	defer a.cached.Store(nil)
	select {
	case <-ctx.Done():
		return nil
	case <-kc.Synced():
	}
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		return nil
	}
	a.cached.Store(&caches{node: kc.Node.GetStore(), nodeSlices: kc.NodeSlices.GetStore(), otherSlices: kc.OtherSlices.GetStore(), classes: kc.Classes.GetStore()})
	a.log.Debug("following claims, slices, classes and the node")
	<-ctx.Done()
	return nil
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
	node, err := a.nodeObj(ctx)
	if err != nil {
		return nil, a.apiError("reading node "+a.node, err)
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
	rules, err := a.listTaintRules(ctx)
	if err != nil {
		return nil, err
	}
	return &inputs{node: node, slices: applyTaintRules(out, rules), classes: classes}, nil
}

// nodeObj is this node's Node: the informer's while Run runs and its store
// holds it, else read from the API.
func (a *Allocator) nodeObj(ctx context.Context) (*corev1.Node, error) {
	if c := a.cached.Load(); c != nil {
		if obj, ok, _ := c.node.GetByKey(a.node); ok {
			if n, ok := obj.(*corev1.Node); ok {
				return n, nil
			}
		}
	}
	return a.client.CoreV1().Nodes().Get(ctx, a.node, metav1.GetOptions{})
}
