// Package slicewatch is this node's ResourceSlices as the dramanager's
// API streams them: it follows the slice informer it is given (the one
// kubecache shares with the claim allocator, so slices are cached once)
// and fans each change out, numbered by a revision, to subscribers through
// a bounded hub (pkg/stream), as every Watch of nodeplug is. The gRPC
// adapter (draserver) converts what it hands out; nothing here knows gRPC.
//
// Safe for concurrent use. Changes are published in the informer's order;
// a subscriber sees the snapshot of its Watch, then every later change.
package slicewatch

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
)

// ChangeType says what happened to a slice.
type ChangeType int

const (
	// Updated: the slice was added or changed (or is in the snapshot).
	Updated ChangeType = iota + 1
	// Removed: the slice was deleted; Slice is its last state.
	Removed
)

// Change is one item of a Watch: a slice (not to be modified) and the
// revision after the change.
type Change struct {
	Type  ChangeType
	Slice *resourcev1.ResourceSlice
	Rev   uint64
}

// Slices follows this node's slices.
type Slices struct {
	inf    cache.SharedIndexInformer
	client kubernetes.Interface
	node   string
	log    *slog.Logger
	hub    *stream.Hub[Change]
	synced chan struct{}
	// who and listErr explain refusals and a list that does not come
	// (Explain).
	who     *kubeaccess.Identity
	listErr func() error

	mu    sync.Mutex
	items map[string]*resourcev1.ResourceSlice // by name
	rev   uint64
}

// New follows node's slices through inf (an informer of this node's
// ResourceSlices: kubecache.Cache.NodeSlices); Run runs it. client lists
// them from the API for List. limits bound the Watch subscribers (zero
// fields: pkg/stream's defaults).
func New(inf cache.SharedIndexInformer, client kubernetes.Interface, node string, limits stream.Limits, log *slog.Logger) *Slices {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Slices{
		inf: inf, client: client, node: node, log: log, synced: make(chan struct{}),
		hub:   stream.NewBoundedHub(limits, func(c Change) int { return c.Slice.Size() + 16 }),
		items: map[string]*resourcev1.ResourceSlice{},
	}
}

// Explain makes the errors say why: who names the identity the API
// refused (PERMISSION_DENIED), listErr returns the informer's last failed
// list or watch (kubecache.Cache.LastError), which a Watch that waited
// in vain for the first list reports. Called before Run.
func (s *Slices) Explain(who *kubeaccess.Identity, listErr func() error) {
	s.who, s.listErr = who, listErr
}

// Run follows the informer (run by its owner) until ctx ends; the Watch
// streams end with it.
func (s *Slices) Run(ctx context.Context) error {
	reg, err := s.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.put(obj) },
		UpdateFunc: func(_, obj any) { s.put(obj) },
		DeleteFunc: s.remove,
	})
	if err != nil {
		return fmt.Errorf("ResourceSlice informer: %w", err)
	}
	defer func() { _ = s.inf.RemoveEventHandler(reg) }()
	if cache.WaitForCacheSync(ctx.Done(), reg.HasSynced) {
		close(s.synced)
	}
	<-ctx.Done()
	s.hub.Close(nil)
	return nil
}

func (s *Slices) put(obj any) {
	rs, ok := obj.(*resourcev1.ResourceSlice)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old := s.items[rs.Name]; old != nil && old.ResourceVersion == rs.ResourceVersion {
		return // a resync or relist with nothing new
	}
	s.items[rs.Name] = rs
	s.rev++
	s.hub.Publish(Change{Type: Updated, Slice: rs, Rev: s.rev})
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
		last = rs
	}
	delete(s.items, rs.Name)
	s.rev++
	s.hub.Publish(Change{Type: Removed, Slice: last, Rev: s.rev})
}

// Watch waits until the informer has listed (or ctx ends), then returns
// the revision of the snapshot and a subscription holding the snapshot
// (driver's slices only, when driver is set) followed by every change.
func (s *Slices) Watch(ctx context.Context, driver string) (uint64, *stream.Subscription[Change], error) {
	if err := s.waitSynced(ctx); err != nil {
		return 0, nil, err
	}
	keep := func(c Change) bool { return driver == "" || c.Slice.Spec.Driver == driver }
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := make([]Change, 0, len(s.items))
	for _, name := range slices.Sorted(maps.Keys(s.items)) {
		c := Change{Type: Updated, Slice: s.items[name], Rev: s.rev}
		if keep(c) {
			snap = append(snap, c)
		}
	}
	sub, err := s.hub.JoinWhere(snap, keep)
	if err != nil {
		return 0, nil, err
	}
	return s.rev, sub, nil
}

// Count returns how many of this node's slices are driver's, as followed
// so far; ok is false until the informer has listed.
func (s *Slices) Count(driver string) (n int, ok bool) {
	select {
	case <-s.synced:
	default:
		return 0, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rs := range s.items {
		if rs.Spec.Driver == driver {
			n++
		}
	}
	return n, true
}

// SyncWait bounds how long a Watch waits for the first list.
var SyncWait = 30 * time.Second

func (s *Slices) waitSynced(ctx context.Context) error {
	t := time.NewTimer(SyncWait)
	defer t.Stop()
	select {
	case <-s.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	var last error
	if s.listErr != nil {
		last = s.listErr()
	}
	if denied := kubeaccess.Denied(last, s.who); denied != nil {
		return fmt.Errorf("this node's ResourceSlices are not listed yet: %w", denied)
	}
	if last != nil {
		return fmt.Errorf("this node's ResourceSlices are not listed yet: %w: %w", last, errdefs.ErrUnavailable)
	}
	return fmt.Errorf("this node's ResourceSlices are not listed yet (the Kubernetes API does not answer): %w", errdefs.ErrUnavailable)
}

// List lists this node's slices (driver's only, when set) from the API,
// sorted by driver and name.
func (s *Slices) List(ctx context.Context, driver string) ([]resourcev1.ResourceSlice, error) {
	sel := fields.Set{resourcev1.ResourceSliceSelectorNodeName: s.node}
	if driver != "" {
		sel[resourcev1.ResourceSliceSelectorDriver] = driver
	}
	list, err := s.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel.String()})
	if denied := kubeaccess.Denied(err, s.who); denied != nil {
		return nil, fmt.Errorf("list ResourceSlices with %s: %w", sel, denied)
	}
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices with %s: %w: %w", sel, err, errdefs.ErrUnavailable)
	}
	items := list.Items
	slices.SortFunc(items, func(a, b resourcev1.ResourceSlice) int {
		return cmp.Or(cmp.Compare(a.Spec.Driver, b.Spec.Driver), cmp.Compare(a.Name, b.Name))
	})
	return items, nil
}
