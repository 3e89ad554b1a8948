package manager

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// ledger is the record of which container holds which device, and of the
// devices reserved by the Allocate calls in flight. It is part of the state
// core and guarded by its mutex; it stages nothing itself (the core stages
// the allocation records it marks, see journalKey).
type ledger struct {
	allocs map[allocKey]*allocation
	// owners maps resource → device → the allocation holding it,
	// committed or reserved by an Allocate in flight.
	owners map[string]map[string]allocKey
	// pods maps the UID of every pod holding an allocation to its
	// namespace and name, fixed by the allocation that came first, and to
	// its allocations (so that a Release touches only the pod's).
	pods map[string]*podRecord
}

func newLedger() ledger {
	return ledger{allocs: map[allocKey]*allocation{}, owners: map[string]map[string]allocKey{}, pods: map[string]*podRecord{}}
}

// allocKey names one container's allocation of one resource.
type allocKey struct{ pod, container, resource string }

func (k allocKey) String() string { return k.pod + "\x00" + k.container + "\x00" + k.resource }

// podIdentity is a pod's optional namespace and name.
type podIdentity struct{ namespace, name string }

func (p podIdentity) named() bool { return p.namespace != "" || p.name != "" }

// podRecord is a pod's identity and the allocations it holds.
type podRecord struct {
	podIdentity
	keys map[allocKey]bool
}

// allocation is one recorded allocation; its fields never change once it
// is recorded.
type allocation struct {
	key       allocKey
	pod       podIdentity
	ids       []string
	resp      *pluginapi.ContainerAllocateResponse
	respBytes []byte // resp as stored
	traceID   string
	at        time.Time
}

// snapshot is the allocator's view of resource: its healthy devices and
// which are taken. It reads l as it is: hold the core's mutex while it is
// used.
func (l *ledger) snapshot(resource string, healthy []string) allocator.Snapshot {
	owners := l.owners[resource]
	return allocator.Snapshot{Resource: resource, Healthy: healthy, Taken: func(id string) bool {
		_, taken := owners[id]
		return taken
	}}
}

// taken reports whether device id of resource is allocated or reserved.
func (l *ledger) taken(resource, id string) bool {
	_, ok := l.owners[resource][id]
	return ok
}

func (l *ledger) reserve(k allocKey, ids []string) {
	owners := l.owners[k.resource]
	if owners == nil {
		owners = map[string]allocKey{}
		l.owners[k.resource] = owners
	}
	for _, id := range ids {
		owners[id] = k
	}
}

// unreserve frees the devices ids that k holds.
func (l *ledger) unreserve(k allocKey, ids []string) {
	owners := l.owners[k.resource]
	for _, id := range ids {
		if o, ok := owners[id]; ok && o == k {
			delete(owners, id)
		}
	}
	if len(owners) == 0 {
		delete(l.owners, k.resource)
	}
}

// checkPod fails with errdefs.ErrFailedPrecondition when want names the
// pod differently from how its first allocation fixed it. A request that
// names no pod always matches.
func (l *ledger) checkPod(uid string, want podIdentity) error {
	p := l.pods[uid]
	if p == nil || !want.named() || p.podIdentity == want {
		return nil
	}
	return fmt.Errorf("pod %s is namespace %s name %s; this request names namespace %s name %s: %w",
		bounds.Quote(uid), bounds.Quote(p.namespace), bounds.Quote(p.name),
		bounds.Quote(want.namespace), bounds.Quote(want.name), errdefs.ErrFailedPrecondition)
}

// add records a and counts it against its pod, whose identity it takes
// when the pod already holds allocations.
func (l *ledger) add(a *allocation) {
	p := l.pods[a.key.pod]
	if p == nil {
		p = &podRecord{podIdentity: a.pod, keys: map[allocKey]bool{}}
		l.pods[a.key.pod] = p
	}
	a.pod = p.podIdentity
	p.keys[a.key] = true
	l.allocs[a.key] = a
}

// remove forgets the allocation of k; a pod left with none is forgotten
// too, so its UID may be named anew.
func (l *ledger) remove(k allocKey) {
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

// podKeys returns the allocations of pod, of one container when container
// is set.
func (l *ledger) podKeys(pod, container string) []allocKey {
	var keys []allocKey
	if p := l.pods[pod]; p != nil {
		for k := range p.keys {
			if container == "" || k.container == container {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// list returns every allocation (of one pod when pod is set), sorted by
// pod, container and resource.
func (l *ledger) list(pod string) []allocator.Allocation {
	var out []allocator.Allocation
	keys := slices.SortedFunc(maps.Keys(l.allocs), func(a, b allocKey) int { return strings.Compare(a.String(), b.String()) })
	for _, k := range keys {
		if pod != "" && k.pod != pod {
			continue
		}
		a := l.allocs[k]
		out = append(out, allocator.Allocation{
			PodUID: k.pod, PodNamespace: a.pod.namespace, PodName: a.pod.name, Container: k.container, Resource: k.resource,
			DeviceIDs: slices.Clone(a.ids), Response: a.resp, TraceID: a.traceID, Allocated: a.at,
		})
	}
	return out
}

// takenIDs returns, sorted, the devices of resource that are allocated or
// reserved.
func (l *ledger) takenIDs(resource string) []string {
	return slices.Sorted(maps.Keys(l.owners[resource]))
}

// restore adds allocations read from the store. A record whose plugin
// response cannot be read keeps its devices allocated, with an empty
// response, and is logged.
func (l *ledger) restore(recs []store.Allocation, log *slog.Logger) {
	for _, r := range recs {
		resp := &pluginapi.ContainerAllocateResponse{}
		if err := proto.Unmarshal(r.Response, resp); err != nil {
			log.Error("checkpoint allocation with an unreadable plugin response; keeping its devices allocated",
				"pod_uid", r.PodUID, "container", r.ContainerName, "resource", r.ResourceName, "error", err)
		}
		k := allocKey{r.PodUID, r.ContainerName, r.ResourceName}
		if old := l.allocs[k]; old != nil {
			l.remove(k)
			l.unreserve(k, old.ids)
		}
		l.add(&allocation{
			key: k, pod: podIdentity{r.PodNamespace, r.PodName}, ids: r.DeviceIDs, resp: resp, respBytes: r.Response,
			traceID: r.TraceID, at: r.Allocated,
		})
		l.reserve(k, r.DeviceIDs)
	}
}

// stage adds to b the record of k: its allocation, or its removal.
func (l *ledger) stage(b *store.Batch, k allocKey) {
	a := l.allocs[k]
	if a == nil {
		b.RemovedAllocations = append(b.RemovedAllocations, store.AllocationKey{PodUID: k.pod, ContainerName: k.container, ResourceName: k.resource})
		return
	}
	b.Allocations = append(b.Allocations, store.Allocation{
		PodUID: k.pod, PodNamespace: a.pod.namespace, PodName: a.pod.name, ContainerName: k.container, ResourceName: k.resource,
		DeviceIDs: a.ids, Response: a.respBytes, TraceID: a.traceID, Allocated: a.at,
	})
}
