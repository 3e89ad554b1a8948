package allocator

import (
	"fmt"
	"slices"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
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
	if !req.Kind.Valid() {
		return fmt.Errorf("unknown container kind %s: %w", bounds.Quote(string(req.Kind)), errdefs.ErrInvalidArgument)
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

// Snapshot is what a choice of devices is made from: one resource's
// healthy devices, which of them are taken (allocated, or reserved by
// an Allocate in flight), and which taken ones the container may take
// again, at one moment. The state core takes it under its lock and keeps
// the lock while Lowest or Offer read it.
type Snapshot struct {
	Resource string
	// Healthy is sorted; it may be shared, and nobody may change it.
	Healthy []string
	// Taken reports whether a device is allocated or reserved.
	Taken func(id string) bool
	// Reusable are the healthy devices, sorted, that the container may
	// share although they are taken: those of the pod's init containers
	// that no app container or sidecar holds (see ContainerKind). A choice
	// takes them first, as the kubelet takes its devicesToReuse.
	Reusable []string
}

func (s Snapshot) free(id string) bool { return !s.Taken(id) }

func (s Snapshot) reusable(id string) bool {
	_, ok := slices.BinarySearch(s.Reusable, id)
	return ok
}

// checkMust fails when a must-include device of rr is not healthy and
// free (or reusable).
func (s Snapshot) checkMust(rr ResourceRequest) error {
	for _, id := range rr.MustInclude {
		if _, healthy := slices.BinarySearch(s.Healthy, id); !healthy || !s.free(id) && !s.reusable(id) {
			return fmt.Errorf("must-include device %q of %s is not healthy and free: %w", id, s.Resource, errdefs.ErrFailedPrecondition)
		}
	}
	return nil
}

// firsts returns the devices a choice for rr starts with: the
// must-include ones, then reusable ones (lowest first) up to the count;
// and how many of them are reused.
func (s Snapshot) firsts(rr ResourceRequest) (ids []string, reused int) {
	ids = slices.Clone(rr.MustInclude)
	for _, id := range ids {
		if s.reusable(id) {
			reused++
		}
	}
	for _, id := range s.Reusable {
		if len(ids) >= int(rr.Count) {
			break
		}
		if !slices.Contains(rr.MustInclude, id) {
			ids = append(ids, id)
			reused++
		}
	}
	return ids, reused
}

// Lowest chooses rr's devices by default: the must-include ones, the
// reusable ones, and the lowest free healthy IDs, sorted. The walk stops
// once it has the count, so its cost follows the allocations, not the
// devices.
func Lowest(s Snapshot, rr ResourceRequest) ([]string, error) {
	if err := s.checkMust(rr); err != nil {
		return nil, err
	}
	count := int(rr.Count)
	ids, reused := s.firsts(rr)
	for _, id := range s.Healthy {
		if len(ids) >= count {
			break
		}
		if s.free(id) && !slices.Contains(rr.MustInclude, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) < count {
		return nil, unavailable(s.Resource, count-reused, countFree(s.Healthy, s.free))
	}
	slices.Sort(ids)
	return ids, nil
}

// Offering is what a plugin offering GetPreferredAllocation is asked to
// choose from for a request, or the choice when it has none to make.
type Offering struct {
	// Chosen is the whole choice, sorted, when the must-include and the
	// reused devices complete the request and at least one is reused: the
	// kubelet asks the plugin only for devices still needed. Nil
	// otherwise.
	Chosen []string
	// Available are the free healthy devices and those reused, sorted.
	Available []string
	// MustInclude are the request's must-include devices and those
	// reused.
	MustInclude []string
}

// Offer returns what a plugin offering GetPreferredAllocation chooses
// among for rr (MergePreferred then makes the choice of its answer), or
// the choice when the reused devices complete it.
func Offer(s Snapshot, rr ResourceRequest) (Offering, error) {
	if err := s.checkMust(rr); err != nil {
		return Offering{}, err
	}
	must, reused := s.firsts(rr)
	if reused > 0 && len(must) == int(rr.Count) {
		slices.Sort(must)
		return Offering{Chosen: must}, nil
	}
	var avail []string
	nfree := 0
	for _, id := range s.Healthy {
		switch {
		case s.free(id):
			nfree++
			avail = append(avail, id)
		case slices.Contains(must, id):
			avail = append(avail, id) // reused
		}
	}
	if nfree < int(rr.Count)-reused {
		return Offering{}, unavailable(s.Resource, int(rr.Count)-reused, nfree)
	}
	return Offering{Available: avail, MustInclude: must}, nil
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

// MergePreferred builds the choice of count devices from a plugin's
// GetPreferredAllocation answer as the kubelet does (devicesToAllocate):
// the must-include devices first, then the answered IDs that are available,
// in the plugin's order, up to count, then the lowest free IDs in sorted
// order. It returns the choice, sorted, and what was wrong with the answer:
// an answer that is short, empty, too long, repeats an ID, names a device
// that was not offered or leaves out a must-include one is not an error
// (the caller logs it, naming the plugin). avail is sorted (Offer); must is
// a subset of it; count ≤ len(avail).
func MergePreferred(answer, avail, must []string, count int) ([]string, []string) {
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
