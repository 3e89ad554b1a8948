// Package kubecache follows the Kubernetes objects the devicemanager's DRA
// half reads, each kind once, with one informer: the Node, this node's
// ResourceSlices and those of no one node, the DeviceClasses, and the
// ResourceClaims (kept with their identity and allocation only, which is
// what the devices in use need). The claim allocator (claimalloc) decides
// from these stores; the slices view (slicewatch) streams this node's
// slices from the same informer.
//
// Consumers add their event handlers before Run; the stores are complete
// once Synced is closed. Safe for concurrent use.
package kubecache

import (
	"context"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Cache is the devicemanager's informers over one API.
type Cache struct {
	// Node is this node's Node (by metadata.name).
	Node cache.SharedIndexInformer
	// NodeSlices are this node's ResourceSlices (by spec.nodeName).
	NodeSlices cache.SharedIndexInformer
	// OtherSlices are the ResourceSlices of no one node (spec.nodeName
	// empty: node selectors, all nodes).
	OtherSlices cache.SharedIndexInformer
	// Classes are the DeviceClasses.
	Classes cache.SharedIndexInformer
	// Claims are the ResourceClaims, stripped by StripClaim.
	Claims cache.SharedIndexInformer

	factories []informers.SharedInformerFactory
	synced    chan struct{}
}

// New makes the informers for node's objects; Run runs them.
func New(client kubernetes.Interface, node string) (*Cache, error) {
	byField := func(sel fields.Selector) informers.SharedInformerOption {
		return informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = sel.String() })
	}
	all := informers.NewSharedInformerFactory(client, 0)
	nodeF := informers.NewSharedInformerFactoryWithOptions(client, 0, byField(fields.OneTermEqualSelector("metadata.name", node)))
	mineF := informers.NewSharedInformerFactoryWithOptions(client, 0,
		byField(fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, node)))
	otherF := informers.NewSharedInformerFactoryWithOptions(client, 0,
		byField(fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, "")))
	c := &Cache{
		Node:        nodeF.Core().V1().Nodes().Informer(),
		NodeSlices:  mineF.Resource().V1().ResourceSlices().Informer(),
		OtherSlices: otherF.Resource().V1().ResourceSlices().Informer(),
		Classes:     all.Resource().V1().DeviceClasses().Informer(),
		Claims:      all.Resource().V1().ResourceClaims().Informer(),
		factories:   []informers.SharedInformerFactory{all, nodeF, mineF, otherF},
		synced:      make(chan struct{}),
	}
	if err := c.Claims.SetTransform(StripClaim); err != nil {
		return nil, fmt.Errorf("the ResourceClaim informer: %w", err)
	}
	return c, nil
}

// Run starts the informers and runs them until ctx ends; Synced is closed
// once every one has listed.
func (c *Cache) Run(ctx context.Context) error {
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	defer func() {
		for _, f := range c.factories {
			f.Shutdown()
		}
	}()
	if cache.WaitForCacheSync(ctx.Done(), c.Node.HasSynced, c.NodeSlices.HasSynced, c.OtherSlices.HasSynced,
		c.Classes.HasSynced, c.Claims.HasSynced) {
		close(c.synced)
	}
	<-ctx.Done()
	return nil
}

// Synced is closed once every informer has listed.
func (c *Cache) Synced() <-chan struct{} { return c.synced }

// StripClaim keeps of a claim its identity and its allocation.
func StripClaim(obj any) (any, error) {
	c, ok := obj.(*resourcev1.ResourceClaim)
	if !ok {
		return obj, nil
	}
	return &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: c.UID, ResourceVersion: c.ResourceVersion},
		Status:     resourcev1.ResourceClaimStatus{Allocation: c.Status.Allocation},
	}, nil
}
