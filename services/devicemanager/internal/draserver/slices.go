package draserver

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/stream"
)

// change is one item of a WatchResourceSlices stream.
type change struct {
	typ   dmv1.ResourceSliceChangeType
	slice *dmv1.ResourceSlice
	rev   uint64
}

// Slices follows this node's ResourceSlices through an informer (list
// and watch with the field selector spec.nodeName) and fans the changes
// out to WatchResourceSlices subscribers through a bounded hub.
type Slices struct {
	client kubernetes.Interface
	node   string
	log    *slog.Logger
	hub    *stream.Hub[change]
	synced chan struct{}

	mu    sync.Mutex
	items map[string]*dmv1.ResourceSlice // by name
	rev   uint64
}

// NewSlices returns the follower of node's slices; Run runs it. limits
// bound the Watch subscribers (zero fields: pkg/stream's defaults).
func NewSlices(client kubernetes.Interface, node string, limits stream.Limits, log *slog.Logger) *Slices {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Slices{
		client: client, node: node, log: log, synced: make(chan struct{}),
		hub:   stream.NewBoundedHub(limits, func(c change) int { return proto.Size(c.slice) + 16 }),
		items: map[string]*dmv1.ResourceSlice{},
	}
}

func (s *Slices) nodeSelector() string {
	return fields.Set{resourcev1.ResourceSliceSelectorNodeName: s.node}.String()
}

// Run follows the slices until ctx ends; the watch streams end with it.
func (s *Slices) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(s.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = s.nodeSelector() }))
	inf := factory.Resource().V1().ResourceSlices().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.put(obj) },
		UpdateFunc: func(_, obj any) { s.put(obj) },
		DeleteFunc: s.remove,
	}); err != nil {
		return fmt.Errorf("ResourceSlice informer: %w", err)
	}
	factory.Start(ctx.Done())
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		close(s.synced)
	}
	<-ctx.Done()
	factory.Shutdown()
	s.hub.Close(nil)
	return nil
}

func (s *Slices) put(obj any) {
	rs, ok := obj.(*resourcev1.ResourceSlice)
	if !ok {
		return
	}
	item := sliceToAPI(rs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.items[rs.Name]; old != nil && old.GetResourceVersion() == item.GetResourceVersion() {
		return // a resync or relist with nothing new
	}
	s.items[rs.Name] = item
	s.rev++
	s.hub.Publish(change{typ: dmv1.ResourceSliceChangeType_RESOURCE_SLICE_CHANGE_TYPE_UPDATED, slice: item, rev: s.rev})
}

func (s *Slices) remove(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	rs, ok := obj.(*resourcev1.ResourceSlice)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	last := s.items[rs.Name]
	if last == nil {
		last = sliceToAPI(rs)
	}
	delete(s.items, rs.Name)
	s.rev++
	s.hub.Publish(change{typ: dmv1.ResourceSliceChangeType_RESOURCE_SLICE_CHANGE_TYPE_REMOVED, slice: last, rev: s.rev})
}

// Watch waits until the informer has listed (or ctx ends), then returns
// the revision of the snapshot and a subscription holding the snapshot
// (driver's slices only, when driver is set) followed by every change.
func (s *Slices) Watch(ctx context.Context, driver string) (uint64, *stream.Subscription[change], error) {
	if err := s.waitSynced(ctx); err != nil {
		return 0, nil, err
	}
	keep := func(c change) bool { return driver == "" || c.slice.GetDriver() == driver }
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := make([]change, 0, len(s.items))
	for _, name := range sortedKeys(s.items) {
		item := s.items[name]
		if keep(change{slice: item}) {
			snap = append(snap, change{typ: dmv1.ResourceSliceChangeType_RESOURCE_SLICE_CHANGE_TYPE_UPDATED, slice: item, rev: s.rev})
		}
	}
	sub, err := s.hub.JoinWhere(snap, keep)
	if err != nil {
		return 0, nil, err
	}
	return s.rev, sub, nil
}

// syncWait bounds how long a Watch waits for the first list.
var syncWait = 30 * time.Second

func (s *Slices) waitSynced(ctx context.Context) error {
	t := time.NewTimer(syncWait)
	defer t.Stop()
	select {
	case <-s.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("this node's ResourceSlices are not listed yet (the Kubernetes API does not answer): %w", errdefs.ErrUnavailable)
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// List lists this node's slices (driver's only, when set) from the API.
func (s *Slices) List(ctx context.Context, driver string) ([]*dmv1.ResourceSlice, error) {
	sel := fields.Set{resourcev1.ResourceSliceSelectorNodeName: s.node}
	if driver != "" {
		sel[resourcev1.ResourceSliceSelectorDriver] = driver
	}
	list, err := s.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel.String()})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices with %s: %w: %w", sel, err, errdefs.ErrUnavailable)
	}
	items := slices.Clone(list.Items)
	slices.SortFunc(items, func(a, b resourcev1.ResourceSlice) int {
		if a.Spec.Driver != b.Spec.Driver {
			return cmp.Compare(a.Spec.Driver, b.Spec.Driver)
		}
		return cmp.Compare(a.Name, b.Name)
	})
	out := make([]*dmv1.ResourceSlice, 0, len(items))
	for i := range items {
		out = append(out, sliceToAPI(&items[i]))
	}
	return out, nil
}
