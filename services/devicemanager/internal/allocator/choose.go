package allocator

import (
	"context"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/endpoint"
)

// maxResources bounds the resources of one request.
const maxResources = 64

// ValidateRequest checks the shape of a request, as Allocate does first:
// identifiers (pkg/bounds: lengths and characters, errors that echo at most
// bounds.MaxEcho bytes of a value), counts and must-include lists. Errors
// wrap errdefs.ErrInvalidArgument.
func ValidateRequest(req *Request) error {
	if err := bounds.PodUID(req.PodUID); err != nil {
		return err
	}
	if err := bounds.ContainerName(req.Container, false); err != nil {
		return err
	}
	if err := bounds.PodIdentity(req.PodNamespace, req.PodName); err != nil {
		return err
	}
	if len(req.Resources) == 0 {
		return fmt.Errorf("no resources requested: %w", errdefs.ErrInvalidArgument)
	}
	if len(req.Resources) > maxResources {
		return fmt.Errorf("%d resources requested, more than %d: %w", len(req.Resources), maxResources, errdefs.ErrInvalidArgument)
	}
	seen := map[string]bool{}
	for _, rr := range req.Resources {
		name := rr.Name
		if err := bounds.Name("resource name", name); err != nil {
			return err
		}
		if seen[name] {
			return fmt.Errorf("resource %q requested twice: %w", name, errdefs.ErrInvalidArgument)
		}
		seen[name] = true
		if rr.Count <= 0 {
			return fmt.Errorf("count of %q must be > 0, got %d: %w", name, rr.Count, errdefs.ErrInvalidArgument)
		}
		must := rr.MustInclude
		if int64(len(must)) > rr.Count {
			return fmt.Errorf("%d must-include devices of %q exceed the count %d: %w", len(must), name, rr.Count, errdefs.ErrInvalidArgument)
		}
		mseen := map[string]bool{}
		for _, id := range must {
			if err := bounds.DeviceID(id); err != nil {
				return fmt.Errorf("must-include devices of %q: %w", name, err)
			}
			if mseen[id] {
				return fmt.Errorf("must-include devices of %q: repeated ID %q: %w", name, id, errdefs.ErrInvalidArgument)
			}
			mseen[id] = true
		}
	}
	return nil
}

// choose picks and reserves devices for one resource.
func (l *Ledger) choose(ctx context.Context, k key, rr ResourceRequest) (*pick, error) {
	count := int(rr.Count)
	must := rr.MustInclude
	for attempt := 1; ; attempt++ {
		plugin, healthy, err := l.res.Candidates(k.resource)
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		owners := l.owners[k.resource]
		isFree := func(id string) bool {
			_, taken := owners[id]
			return !taken
		}
		for _, id := range must {
			if _, healthy := slices.BinarySearch(healthy, id); !healthy || !isFree(id) {
				l.mu.Unlock()
				return nil, fmt.Errorf("must-include device %q of %s is not healthy and free: %w", id, k.resource, errdefs.ErrFailedPrecondition)
			}
		}
		if !plugin.Options().PreferredAllocation {
			// The lowest free IDs: the walk stops once it has count, so
			// its cost follows the allocations, not the devices.
			ids := slices.Clone(must)
			for _, id := range healthy {
				if len(ids) >= count {
					break
				}
				if isFree(id) && !slices.Contains(must, id) {
					ids = append(ids, id)
				}
			}
			if len(ids) < count {
				free := countFree(healthy, isFree)
				l.mu.Unlock()
				return nil, unavailable(k.resource, count, free)
			}
			slices.Sort(ids)
			l.reserveLocked(k, ids)
			l.mu.Unlock()
			return &pick{key: k, ids: ids, plugin: plugin}, nil
		}
		// The plugin chooses among every free device.
		var free []string
		for _, id := range healthy {
			if isFree(id) {
				free = append(free, id)
			}
		}
		if len(free) < count {
			l.mu.Unlock()
			return nil, unavailable(k.resource, count, len(free))
		}
		l.mu.Unlock()

		ids, err := l.preferred(ctx, plugin, free, must, count)
		if err != nil {
			return nil, err
		}
		health := l.res.Health(k.resource, ids)
		l.mu.Lock()
		ok := !slices.Contains(health, false)
		for _, id := range ids {
			if _, taken := l.owners[k.resource][id]; taken {
				ok = false
			}
		}
		if ok {
			l.reserveLocked(k, ids)
			l.mu.Unlock()
			return &pick{key: k, ids: ids, plugin: plugin}, nil
		}
		l.mu.Unlock()
		if attempt == maxPickAttempts {
			return nil, fmt.Errorf("devices of %s preferred by its plugin were taken concurrently %d times: %w", k.resource, attempt, errdefs.ErrFailedPrecondition)
		}
	}
}

// unavailable is the kubelet's error for a request of count devices of
// resource when only free are healthy and free.
func unavailable(resource string, count, free int) error {
	return fmt.Errorf("requested number of devices unavailable for %s. Requested: %d, Available: %d: %w",
		resource, count, free, errdefs.ErrFailedPrecondition)
}

func countFree(ids []string, isFree func(string) bool) int {
	n := 0
	for _, id := range ids {
		if isFree(id) {
			n++
		}
	}
	return n
}

// preferred asks the plugin for its choice and treats the answer as the
// kubelet does (devicesToAllocate): the must-include devices first, then the
// answered IDs that are available, in the plugin's order, up to count, then
// the lowest free IDs in sorted order. An answer that is short, empty, too
// long, repeats an ID, names a device that was not offered or leaves out a
// must-include one is not an error: it is logged at warn, naming the
// plugin. Only a failed call fails the allocation. avail is sorted.
func (l *Ledger) preferred(ctx context.Context, plugin endpoint.Plugin, avail, must []string, count int) ([]string, error) {
	answer, err := plugin.GetPreferredAllocation(ctx, avail, must, count)
	if err != nil {
		return nil, err
	}
	ids, problems := mergePreferred(answer, avail, must, count)
	if len(problems) > 0 {
		l.log.WarnContext(ctx, "device plugin's preferred allocation not used as answered; the rest chosen by default",
			"plugin", plugin.String(), "answer", bounds.Quote(fmt.Sprint(answer)), "problems", problems, "devices", ids)
	}
	return ids, nil
}

// mergePreferred builds the choice of count devices from a preferred answer
// (see preferred), sorted, and says what was wrong with the answer. avail is
// sorted; must is a subset of it; count ≤ len(avail).
func mergePreferred(answer, avail, must []string, count int) ([]string, []string) {
	var problems []string
	ids := make([]string, 0, count)
	chosen := make(map[string]bool, count)
	add := func(id string) {
		ids = append(ids, id)
		chosen[id] = true
	}
	for _, id := range must {
		add(id)
	}
	answered := make(map[string]bool, len(answer))
	var foreign, repeated int
	for _, id := range answer {
		if answered[id] {
			repeated++
			continue
		}
		answered[id] = true
		if _, ok := slices.BinarySearch(avail, id); !ok {
			foreign++
			continue
		}
		if !chosen[id] && len(ids) < count {
			add(id)
		}
	}
	preferredTaken := len(ids)
	for _, id := range avail {
		if len(ids) == count {
			break
		}
		if !chosen[id] {
			add(id)
		}
	}
	if foreign > 0 {
		problems = append(problems, fmt.Sprintf("%d IDs not offered", foreign))
	}
	if repeated > 0 {
		problems = append(problems, fmt.Sprintf("%d IDs repeated", repeated))
	}
	var missing int
	for _, id := range must {
		if !answered[id] {
			missing++
		}
	}
	if missing > 0 {
		problems = append(problems, fmt.Sprintf("%d must-include IDs missing", missing))
	}
	if len(answer) != count {
		problems = append(problems, fmt.Sprintf("%d IDs answered, %d asked", len(answer), count))
	}
	if filled := count - preferredTaken; filled > 0 && len(problems) == 0 {
		problems = append(problems, fmt.Sprintf("%d devices filled in", filled))
	}
	slices.Sort(ids)
	return ids, problems
}

// callPlugin runs Allocate, then PreStartContainer when required.
func (l *Ledger) callPlugin(ctx context.Context, p *pick) error {
	start := time.Now()
	resp, err := p.plugin.Allocate(ctx, p.ids)
	l.metrics.allocDuration.WithLabelValues(p.key.resource).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if err != nil {
		return fmt.Errorf("device plugin %s: encode allocation response: %v: %w", p.plugin, err, errdefs.ErrInternal)
	}
	p.resp, p.respBytes = resp, b
	if p.plugin.Options().PreStartRequired {
		return p.plugin.PreStartContainer(ctx, p.ids)
	}
	return nil
}
