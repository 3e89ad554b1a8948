// Package kubecache follows the Kubernetes objects the dramanager's DRA
// half reads, each kind once, with one informer: the Node, this node's
// ResourceSlices and those of no one node, the DeviceClasses, and the
// ResourceClaims (kept with their identity and allocation only, which is
// what the devices in use need). The claim allocator (claimalloc) decides
// from these stores; the slices view (slicewatch) streams this node's
// slices from the same informer.
//
// Consumers add their event handlers before Run; the stores are complete
// once Synced is closed; LastError says why an informer has not synced.
// Safe for concurrent use.
package kubecache

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Cache is the dramanager's informers over one API.
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
	// TaintRules follows the DeviceTaintRules (nil unless WithTaintRules).
	TaintRules cache.SharedIndexInformer

	synced chan struct{}
	// failed holds, per informer, its last failed list or watch.
	failed map[cache.SharedIndexInformer]*lastError
}

// lastError is an informer's last failed list or watch.
type lastError struct {
	mu  sync.Mutex
	err error
}

// New makes the informers for node's objects; Run runs them.
//
// Each informer is built from its typed client's List and Watch rather
// than from client-go's informer factory: the factory's package pulls in
// the informers and listers of every API group (some 120 packages the
// dramanager would compile and link for the five it reads).
func New(client kubernetes.Interface, node string, opts ...Option) (*Cache, error) {
	nodeName := fields.OneTermEqualSelector("metadata.name", node).String()
	mine := fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, node).String()
	other := fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, "").String()
	nodes, res := client.CoreV1().Nodes(), client.ResourceV1()
	slices := func(sel string) cache.SharedIndexInformer {
		return informer(client, &resourcev1.ResourceSlice{}, sel,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return res.ResourceSlices().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return res.ResourceSlices().Watch(ctx, o)
			})
	}
	c := &Cache{
		Node: informer(client, &corev1.Node{}, nodeName,
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return nodes.List(ctx, o) },
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return nodes.Watch(ctx, o) }),
		NodeSlices:  slices(mine),
		OtherSlices: slices(other),
		Classes: informer(client, &resourcev1.DeviceClass{}, "",
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return res.DeviceClasses().List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return res.DeviceClasses().Watch(ctx, o)
			}),
		Claims: informer(client, &resourcev1.ResourceClaim{}, "",
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return res.ResourceClaims(metav1.NamespaceAll).List(ctx, o)
			},
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return res.ResourceClaims(metav1.NamespaceAll).Watch(ctx, o)
			}),
		synced: make(chan struct{}),
	}
	for _, o := range opts {
		o(c, client)
	}
	if err := c.Claims.SetTransform(StripClaim); err != nil {
		return nil, fmt.Errorf("the ResourceClaim informer: %w", err)
	}
	c.failed = map[cache.SharedIndexInformer]*lastError{}
	for _, inf := range c.all() {
		last := &lastError{}
		c.failed[inf] = last
		// client-go's handler still logs the failure.
		if err := inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			last.mu.Lock()
			last.err = err
			last.mu.Unlock()
			cache.DefaultWatchErrorHandler(ctx, r, err)
		}); err != nil {
			return nil, fmt.Errorf("an informer's error handler: %w", err)
		}
	}
	return c, nil
}

func (c *Cache) all() []cache.SharedIndexInformer {
	all := []cache.SharedIndexInformer{c.Node, c.NodeSlices, c.OtherSlices, c.Classes, c.Claims}
	if c.TaintRules != nil {
		all = append(all, c.TaintRules)
	}
	return all
}

// Option adds to what a Cache follows.
type Option func(*Cache, kubernetes.Interface)

// WithTaintRules follows the DeviceTaintRules too (TaintRules): with the
// node-local API, where the dramanager applies them.
func WithTaintRules() Option {
	return func(c *Cache, client kubernetes.Interface) {
		rules := client.ResourceV1().DeviceTaintRules()
		c.TaintRules = informer(client, &resourcev1.DeviceTaintRule{}, "",
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return rules.List(ctx, o) },
			func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return rules.Watch(ctx, o) })
	}
}

// LastError returns the last failed list or watch of inf (one of c's
// informers), nil when none failed: why an informer that has not synced
// has not (a permission refused, the API unreachable). It is kept after
// a later success.
func (c *Cache) LastError(inf cache.SharedIndexInformer) error {
	last := c.failed[inf]
	if last == nil {
		return nil
	}
	last.mu.Lock()
	defer last.mu.Unlock()
	return last.err
}

// informer is a shared informer of one kind, listed and watched with
// fieldSelector (empty: all), indexed by namespace as the factory's are;
// it lists with the watch-list semantics client supports, as theirs do.
func informer(client kubernetes.Interface, obj runtime.Object, fieldSelector string,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error),
) cache.SharedIndexInformer {
	tweak := func(o *metav1.ListOptions) { o.FieldSelector = fieldSelector }
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return watchFn(ctx, o)
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, client), obj, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
}

// Run starts the informers and runs them until ctx ends; Synced is closed
// once every one has listed.
func (c *Cache) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, inf := range c.all() {
		wg.Add(1)
		go func() { defer wg.Done(); inf.RunWithContext(ctx) }()
	}
	defer wg.Wait()
	var synced []cache.InformerSynced
	for _, inf := range c.all() {
		synced = append(synced, inf.HasSynced)
	}
	if cache.WaitForCacheSync(ctx.Done(), synced...) {
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
