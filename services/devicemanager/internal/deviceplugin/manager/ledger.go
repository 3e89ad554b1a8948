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
	// owners maps resource → device → the allocations holding it,
	// committed or reserved by an Allocate in flight. A device has one
	// holder, or several containers of one pod: an init container's and
	// those that took its devices again (see allocator.ContainerKind).
	owners map[string]map[string][]holder
	// pods maps the UID of every pod holding an allocation to its
	// namespace and name, fixed by the allocation that came first, and to
	// its allocations (so that a Release touches only the pod's).
	pods map[string]*podRecord
}

func newLedger() ledger {
	return ledger{allocs: map[allocKey]*allocation{}, owners: map[string]map[string][]holder{}, pods: map[string]*podRecord{}}
}

// holder is one allocation holding a device, with its container's kind.
type holder struct {
	key  allocKey
	kind allocator.ContainerKind
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
	kind      allocator.ContainerKind
	ids       []string
	resp      *pluginapi.ContainerAllocateResponse
	respBytes []byte // resp as stored
	traceID   string
	at        time.Time
}

// snapshot is the allocator's view of k's resource for a container of
// kind: its healthy devices, which are taken, and which of those the
// container may take again (reusable). It reads l as it is: hold the
// core's mutex while it is used.
func (l *ledger) snapshot(k allocKey, kind allocator.ContainerKind, healthy []string) allocator.Snapshot {
	owners := l.owners[k.resource]
	return allocator.Snapshot{Resource: k.resource, Healthy: healthy, Taken: func(id string) bool {
		return len(owners[id]) > 0
	}, Reusable: l.reusable(k, healthy)}
}

// reusable returns, sorted, the healthy devices of k's resource that k's
// container may take although they are taken, as the kubelet's
// devicesToReuse holds them: those of the pod's init containers
// (committed) that no app container or sidecar holds. Whatever its kind,
// a container takes them first; an init container's devices are then
// reusable by the next ones, an app container's or a sidecar's by none.
func (l *ledger) reusable(k allocKey, healthy []string) []string {
	p := l.pods[k.pod]
	if p == nil {
		return nil
	}
	var out []string
	for ik := range p.keys {
		a := l.allocs[ik]
		if ik.resource != k.resource || ik.container == k.container || a.kind != allocator.KindInit {
			continue
		}
		for _, id := range a.ids {
			if _, ok := slices.BinarySearch(healthy, id); ok && l.sharable(k.resource, id) {
				out = append(out, id)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// sharable reports whether every holder of device id of resource is an
// init container.
func (l *ledger) sharable(resource, id string) bool {
	for _, h := range l.owners[resource][id] {
		if h.kind != allocator.KindInit {
			return false
		}
	}
	return true
}

// taken reports whether device id of resource is allocated or reserved.
func (l *ledger) taken(resource, id string) bool {
	return len(l.owners[resource][id]) > 0
}

// holders returns the allocations holding device id of resource.
func (l *ledger) holders(resource, id string) []holder {
	return l.owners[resource][id]
}

// reserve makes k, a container of kind, a holder of ids.
func (l *ledger) reserve(k allocKey, kind allocator.ContainerKind, ids []string) {
	owners := l.owners[k.resource]
	if owners == nil {
		owners = map[string][]holder{}
		l.owners[k.resource] = owners
	}
	for _, id := range ids {
		if !slices.ContainsFunc(owners[id], func(h holder) bool { return h.key == k }) {
			owners[id] = append(owners[id], holder{key: k, kind: kind})
		}
	}
}

// unreserve takes k from the holders of ids; a device with no holder left
// is free.
func (l *ledger) unreserve(k allocKey, ids []string) {
	owners := l.owners[k.resource]
	for _, id := range ids {
		hs := slices.DeleteFunc(owners[id], func(h holder) bool { return h.key == k })
		if len(hs) == 0 {
			delete(owners, id)
		} else {
			owners[id] = hs
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
			PodUID: k.pod, PodNamespace: a.pod.namespace, PodName: a.pod.name, Container: k.container, Kind: a.kind, Resource: k.resource,
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
// response, and is logged. A device several records hold (an init
// container's and those that took it again; or, from a kubelet's
// checkpoint, containers of one pod) has them all as holders: it is free
// once they are all released.
func (l *ledger) restore(recs []store.Allocation, log *slog.Logger) {
	for _, r := range recs {
		resp := &pluginapi.ContainerAllocateResponse{}
		if err := proto.Unmarshal(r.Response, resp); err != nil {
			log.Error("checkpoint allocation with an unreadable plugin response; keeping its devices allocated",
				"pod_uid", r.PodUID, "container", r.ContainerName, "resource", r.ResourceName, "error", err)
		}
		k := allocKey{r.PodUID, r.ContainerName, r.ResourceName}
		kind := allocator.ContainerKind(r.ContainerKind)
		if !kind.Valid() {
			log.Error("checkpoint allocation of an unknown container kind; taken for an app container's",
				"pod_uid", r.PodUID, "container", r.ContainerName, "resource", r.ResourceName, "kind", bounds.Quote(r.ContainerKind))
			kind = allocator.KindApp
		}
		if old := l.allocs[k]; old != nil {
			l.remove(k)
			l.unreserve(k, old.ids)
		}
		l.add(&allocation{
			key: k, pod: podIdentity{r.PodNamespace, r.PodName}, kind: kind, ids: r.DeviceIDs, resp: resp, respBytes: r.Response,
			traceID: r.TraceID, at: r.Allocated,
		})
		l.reserve(k, kind, r.DeviceIDs)
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
		DeviceIDs: a.ids, Response: a.respBytes, TraceID: a.traceID, Allocated: a.at, ContainerKind: string(a.kind),
	})
}
