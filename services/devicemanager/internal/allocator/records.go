package allocator

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/store"
)

func (l *Ledger) reserveLocked(k key, ids []string) {
	owners := l.owners[k.resource]
	if owners == nil {
		owners = map[string]key{}
		l.owners[k.resource] = owners
	}
	for _, id := range ids {
		owners[id] = k
	}
}

// unreserveLocked frees the devices ids that k holds.
func (l *Ledger) unreserveLocked(k key, ids []string) {
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

// Release implements Allocator.
func (l *Ledger) Release(ctx context.Context, pod, container string) (int64, error) {
	if err := bounds.PodUID(pod); err != nil {
		return 0, err
	}
	if err := bounds.ContainerName(container, true); err != nil {
		return 0, err
	}
	var n int64
	var resources []string
	l.mu.Lock()
	var keys []key
	if p := l.pods[pod]; p != nil {
		for k := range p.keys {
			if container == "" || k.container == container {
				keys = append(keys, k)
			}
		}
	}
	for _, k := range keys {
		a := l.allocs[k]
		l.removeLocked(k)
		l.unreserveLocked(k, a.ids)
		l.dirty[k] = true
		n += int64(len(a.ids))
		resources = append(resources, k.resource)
		l.metrics.released.WithLabelValues(k.resource).Add(float64(len(a.ids)))
	}
	l.mu.Unlock()
	if n == 0 {
		// Nothing to free here; but an earlier Release of the same
		// devices may have failed to save (this may be its retry): the
		// answer says they are free, so that must be durable.
		if err := l.persist(); err != nil {
			return 0, fmt.Errorf("release not saved: %v: %w", err, errdefs.ErrInternal)
		}
		return 0, nil
	}
	l.res.AllocationsChanged(resources)
	if l.log.Enabled(ctx, slog.LevelDebug) {
		l.log.DebugContext(ctx, "devices released", "pod_uid", pod, "container", container, "devices", n)
	}
	if err := l.persist(); err != nil {
		return n, fmt.Errorf("release not saved: %v: %w", err, errdefs.ErrInternal)
	}
	return n, nil
}

func (l *Ledger) sortedKeysLocked() []key {
	return slices.SortedFunc(maps.Keys(l.allocs), func(a, b key) int { return strings.Compare(a.String(), b.String()) })
}

// List implements Allocator.
func (l *Ledger) List(pod string) []Allocation {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []Allocation
	for _, k := range l.sortedKeysLocked() {
		if pod != "" && k.pod != pod {
			continue
		}
		a := l.allocs[k]
		out = append(out, Allocation{
			PodUID: k.pod, PodNamespace: a.pod.namespace, PodName: a.pod.name, Container: k.container, Resource: k.resource,
			DeviceIDs: slices.Clone(a.ids), Response: a.resp, TraceID: a.traceID, Allocated: a.at,
		})
	}
	return out
}

// Taken implements Allocator.
func (l *Ledger) Taken(resource string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Sorted(maps.Keys(l.owners[resource]))
}

// Restore implements Allocator. A record whose plugin response cannot be
// read keeps its devices allocated, with an empty response, and is logged.
func (l *Ledger) Restore(recs []store.Allocation) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range recs {
		resp := &pluginapi.ContainerAllocateResponse{}
		if err := proto.Unmarshal(r.Response, resp); err != nil {
			l.log.Error("checkpoint allocation with an unreadable plugin response; keeping its devices allocated",
				"pod_uid", r.PodUID, "container", r.ContainerName, "resource", r.ResourceName, "error", err)
		}
		k := key{r.PodUID, r.ContainerName, r.ResourceName}
		if old := l.allocs[k]; old != nil {
			l.removeLocked(k)
			l.unreserveLocked(k, old.ids)
		}
		l.addLocked(&allocation{
			key: k, pod: podIdentity{r.PodNamespace, r.PodName}, ids: r.DeviceIDs, resp: resp, respBytes: r.Response,
			traceID: r.TraceID, at: r.Allocated,
		})
		l.reserveLocked(k, r.DeviceIDs)
	}
}

// Stage implements Allocator.
func (l *Ledger) Stage(b *store.Batch) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for k := range l.dirty {
		a := l.allocs[k]
		if a == nil {
			b.RemovedAllocations = append(b.RemovedAllocations, store.AllocationKey{PodUID: k.pod, ContainerName: k.container, ResourceName: k.resource})
			continue
		}
		b.Allocations = append(b.Allocations, store.Allocation{
			PodUID: k.pod, PodNamespace: a.pod.namespace, PodName: a.pod.name, ContainerName: k.container, ResourceName: k.resource,
			DeviceIDs: a.ids, Response: a.respBytes, TraceID: a.traceID, Allocated: a.at,
		})
	}
	clear(l.dirty)
}
