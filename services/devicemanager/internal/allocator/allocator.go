// Package allocator chooses devices for containers and keeps the record of
// which container holds which device: choice, reservation, the plugin's
// preferred allocation, the plugin calls, and rollback.
//
// An Allocate for a container:
//  1. returns the saved answer when the same request was made before (the
//     plugin is not called again);
//  2. chooses, per resource, healthy free devices, the must-include ones
//     first: when the plugin offers GetPreferredAllocation, then the
//     answered IDs that are available, in its order, and the rest by
//     default (the kubelet's devicesToAllocate: a short, empty or foreign
//     answer is logged, not an error); else the lowest IDs in sorted order;
//  3. reserves them before any plugin call, so two concurrent requests
//     never get the same device;
//  4. calls the plugin's Allocate, then PreStartContainer when required;
//  5. records the allocation and makes it durable before it returns.
//
// Any failure releases every reservation of the request: nothing stays
// allocated. The device sets themselves belong to the manager, which the
// Ledger sees through the Resources interface.
package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/endpoint"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/keylock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/store"
)

// maxPickAttempts bounds how often a choice made with no lock held
// (GetPreferredAllocation) is retried when a concurrent allocation took one
// of its devices.
const maxPickAttempts = 5

var tracer = telemetry.Tracer("github.com/nodeplug/nodeplug/services/devicemanager")

// Allocator allocates devices to containers and records who holds what.
//
// Thread safety and ordering: every method is safe for concurrent use.
// Allocate calls for the same pod and container run one at a time, so
// concurrent identical requests yield one allocation; other calls run
// concurrently. An Allocate or Release that returns nil has made its change
// durable.
type Allocator interface {
	// Allocate gives devices to one container (see the package doc).
	Allocate(ctx context.Context, req *Request) ([]ResourceAllocation, error)
	// Release frees the devices of a pod, or of one of its containers when
	// container is set, and returns how many were freed. Releasing what is
	// not there frees nothing and succeeds.
	Release(ctx context.Context, pod, container string) (int64, error)
	// List returns every allocation (of one pod when pod is set), sorted by
	// pod, container and resource. The plugin responses are shared:
	// callers must not modify them.
	List(pod string) []Allocation
	// Taken returns, sorted, the devices of resource that are allocated or
	// reserved by an Allocate in flight.
	Taken(resource string) []string
	// Restore adds allocations read from the store. Call it before serving.
	Restore(recs []store.Allocation)
	// Stage moves into b every allocation change not staged before, for
	// the next store commit.
	Stage(b *store.Batch)
}

// Resources is the Ledger's view of the device sets, which the manager
// owns. The Ledger calls it with none of its own locks held, so its methods
// may call the Ledger's Taken.
type Resources interface {
	// Candidates returns the plugin that allocates devices of resource
	// and its healthy devices, sorted; the slice may be shared, and the
	// caller must not change it. It fails with errdefs.ErrNotFound
	// for an unknown resource and errdefs.ErrFailedPrecondition when the
	// resource has no live endpoint or no healthy device.
	Candidates(resource string) (endpoint.Plugin, []string, error)
	// Health reports, for each of ids, whether resource has that device
	// and it is healthy now.
	Health(resource string, ids []string) []bool
	// Known reports whether resource is registered (has a device set).
	Known(resource string) bool
	// AllocationsChanged is told, after the change, the resources whose
	// allocations changed.
	AllocationsChanged(resources []string)
}

// Config configures a Ledger.
type Config struct {
	Resources Resources
	// Persist makes every change staged so far durable (see Stage).
	// Allocate and Release call it before they return.
	Persist func() error
	Log     *slog.Logger
	// Registerer receives the metrics; nil means none are registered.
	Registerer prometheus.Registerer
}

// Ledger is the Allocator: the record of every allocation and of the
// reservations of the Allocate calls in flight.
type Ledger struct {
	res     Resources
	persist func() error
	log     *slog.Logger
	metrics *metrics

	containers keylock.Mutex // per pod and container

	mu     sync.Mutex
	allocs map[key]*allocation
	// owners maps resource → device → the allocation holding it,
	// committed or reserved by an Allocate in flight.
	owners map[string]map[string]key
	// pods maps the UID of every pod holding an allocation to its
	// namespace and name, fixed by the allocation that came first, and to
	// its allocations (so that a Release touches only the pod's).
	pods  map[string]*podRecord
	dirty map[key]bool // changed since the last Stage
}

// podIdentity is a pod's optional namespace and name.
type podIdentity struct{ namespace, name string }

func (p podIdentity) named() bool { return p.namespace != "" || p.name != "" }

// podRecord is a pod's identity and the allocations it holds.
type podRecord struct {
	podIdentity
	keys map[key]bool
}

var _ Allocator = (*Ledger)(nil)

type key struct{ pod, container, resource string }

func (k key) String() string { return k.pod + "\x00" + k.container + "\x00" + k.resource }

type allocation struct {
	key       key
	pod       podIdentity
	ids       []string
	resp      *pluginapi.ContainerAllocateResponse
	respBytes []byte // resp as stored
	traceID   string
	at        time.Time
}

// New returns an empty Ledger.
func New(cfg Config) *Ledger {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Ledger{
		res: cfg.Resources, persist: cfg.Persist, log: cfg.Log, metrics: newMetrics(cfg.Registerer),
		allocs: map[key]*allocation{}, owners: map[string]map[string]key{}, pods: map[string]*podRecord{}, dirty: map[key]bool{},
	}
}

// pick is the devices chosen and reserved for one resource of a request,
// with the plugin that will allocate them.
type pick struct {
	key       key
	ids       []string
	plugin    endpoint.Plugin
	resp      *pluginapi.ContainerAllocateResponse
	respBytes []byte
}

// Allocate implements Allocator.
func (l *Ledger) Allocate(ctx context.Context, req *Request) ([]ResourceAllocation, error) {
	if err := ValidateRequest(req); err != nil {
		return nil, err
	}
	ctx, span := tracer.Start(ctx, "allocate")
	defer span.End()
	span.SetAttributes(attribute.String("pod_uid", req.PodUID), attribute.String("container", req.Container))
	resp, err := l.allocate(ctx, req)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		// Metric labels only name registered resources, never what a
		// caller asked for.
		for _, rr := range req.Resources {
			if l.res.Known(rr.Name) {
				l.metrics.allocations.WithLabelValues(rr.Name, "failed").Inc()
			}
		}
		return nil, err
	}
	return resp, nil
}

func (l *Ledger) allocate(ctx context.Context, req *Request) ([]ResourceAllocation, error) {
	unlock := l.containers.Lock(req.PodUID + "\x00" + req.Container)
	defer unlock()

	// Saved answers, and the resources that need new devices.
	want := podIdentity{req.PodNamespace, req.PodName}
	var todo []ResourceRequest
	l.mu.Lock()
	if err := l.checkPodLocked(req.PodUID, want); err != nil {
		l.mu.Unlock()
		return nil, err
	}
	for _, rr := range req.Resources {
		k := key{req.PodUID, req.Container, rr.Name}
		if a := l.allocs[k]; a != nil {
			if int64(len(a.ids)) != rr.Count {
				l.mu.Unlock()
				return nil, fmt.Errorf("pod %q container %q changed request for resource %q from %d to %d: %w",
					k.pod, k.container, k.resource, len(a.ids), rr.Count, errdefs.ErrFailedPrecondition)
			}
			continue
		}
		todo = append(todo, rr)
	}
	l.mu.Unlock()

	var picks []*pick
	rollback := func() {
		l.mu.Lock()
		for _, p := range picks {
			l.unreserveLocked(p.key, p.ids)
		}
		l.mu.Unlock()
	}
	for _, rr := range todo {
		p, err := l.choose(ctx, key{req.PodUID, req.Container, rr.Name}, rr)
		if err != nil {
			rollback()
			return nil, err
		}
		picks = append(picks, p)
	}
	for _, p := range picks {
		if err := l.callPlugin(ctx, p); err != nil {
			rollback()
			return nil, err
		}
	}
	if len(picks) > 0 {
		if err := l.commit(ctx, want, picks); err != nil {
			return nil, err
		}
	}

	l.mu.Lock()
	found := make([]*allocation, 0, len(req.Resources))
	for _, rr := range req.Resources {
		a := l.allocs[key{req.PodUID, req.Container, rr.Name}]
		if a == nil {
			l.mu.Unlock()
			// Released by a concurrent Release after it was made.
			return nil, fmt.Errorf("allocation of %q for pod %q container %q was released while being made: %w",
				rr.Name, req.PodUID, req.Container, errdefs.ErrFailedPrecondition)
		}
		found = append(found, a)
	}
	l.mu.Unlock()
	out := make([]ResourceAllocation, 0, len(found))
	for _, a := range found {
		out = append(out, l.view(a))
	}
	if len(picks) == 0 {
		for _, rr := range req.Resources {
			l.metrics.allocations.WithLabelValues(rr.Name, "reused").Inc()
		}
	}
	return out, nil
}

// checkPodLocked fails with errdefs.ErrFailedPrecondition when want names
// the pod differently from how its first allocation fixed it. A request
// that names no pod always matches.
func (l *Ledger) checkPodLocked(uid string, want podIdentity) error {
	p := l.pods[uid]
	if p == nil || !want.named() || p.podIdentity == want {
		return nil
	}
	return fmt.Errorf("pod %s is namespace %s name %s; this request names namespace %s name %s: %w",
		bounds.Quote(uid), bounds.Quote(p.namespace), bounds.Quote(p.name),
		bounds.Quote(want.namespace), bounds.Quote(want.name), errdefs.ErrFailedPrecondition)
}

// addLocked records a and counts it against its pod, whose identity it
// takes when the pod already holds allocations.
func (l *Ledger) addLocked(a *allocation) {
	p := l.pods[a.key.pod]
	if p == nil {
		p = &podRecord{podIdentity: a.pod, keys: map[key]bool{}}
		l.pods[a.key.pod] = p
	}
	a.pod = p.podIdentity
	p.keys[a.key] = true
	l.allocs[a.key] = a
}

// removeLocked forgets the allocation of k; a pod left with none is
// forgotten too, so its UID may be named anew.
func (l *Ledger) removeLocked(k key) {
	if _, ok := l.allocs[k]; !ok {
		return
	}
	delete(l.allocs, k)
	if p := l.pods[k.pod]; p != nil {
		delete(p.keys, k)
		if len(p.keys) == 0 {
			delete(l.pods, k.pod)
		}
	}
}

// commit records the allocations of picks for a pod named want and makes
// them durable; when they cannot be saved, or a concurrent Allocate of
// another container fixed the pod's identity differently, it takes them
// back.
func (l *Ledger) commit(ctx context.Context, want podIdentity, picks []*pick) error {
	now, traceID := time.Now(), telemetry.TraceID(ctx)
	resources := make([]string, 0, len(picks))
	l.mu.Lock()
	if err := l.checkPodLocked(picks[0].key.pod, want); err != nil {
		for _, p := range picks {
			l.unreserveLocked(p.key, p.ids)
		}
		l.mu.Unlock()
		return err
	}
	for _, p := range picks {
		l.addLocked(&allocation{key: p.key, pod: want, ids: p.ids, resp: p.resp, respBytes: p.respBytes, traceID: traceID, at: now})
		l.dirty[p.key] = true
		resources = append(resources, p.key.resource)
	}
	l.mu.Unlock()
	l.res.AllocationsChanged(resources)
	if err := l.persist(); err != nil {
		l.mu.Lock()
		for _, p := range picks {
			l.removeLocked(p.key)
			l.unreserveLocked(p.key, p.ids)
			l.dirty[p.key] = true
		}
		l.mu.Unlock()
		l.res.AllocationsChanged(resources)
		if err2 := l.persist(); err2 != nil {
			l.log.ErrorContext(ctx, "writing checkpoint after rollback", "error", err2)
		}
		return fmt.Errorf("allocation not saved: %v: %w", err, errdefs.ErrInternal)
	}
	// Debug, as the kubelet logs each allocation at verbosity 3: at
	// thousands of allocations a second an Info line apiece was 5 % of the
	// devicemanager's CPU. The metrics count them; ListAllocations and the
	// trace show each one. Checked first: the arguments alone, boxed for
	// the call, are allocations that the logger would discard.
	debug := l.log.Enabled(ctx, slog.LevelDebug)
	for _, p := range picks {
		l.metrics.allocations.WithLabelValues(p.key.resource, "allocated").Inc()
		if debug {
			l.log.DebugContext(ctx, "devices allocated", "pod_uid", p.key.pod, "container", p.key.container,
				"resource", p.key.resource, "devices", p.ids)
		}
	}
	return nil
}

// view describes a, with the current health of its devices. a's fields
// never change once it is recorded, so no lock is needed.
func (l *Ledger) view(a *allocation) ResourceAllocation {
	v := ResourceAllocation{
		Resource: a.key.resource, DeviceIDs: slices.Clone(a.ids), Response: a.resp,
		PodNamespace: a.pod.namespace, PodName: a.pod.name,
	}
	for i, healthy := range l.res.Health(a.key.resource, a.ids) {
		v.Devices = append(v.Devices, DeviceStatus{ID: a.ids[i], Healthy: healthy})
	}
	return v
}
