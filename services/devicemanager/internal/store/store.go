// Package store keeps the devicemanager's state durable: one record per
// resource (its devices and endpoints) and one per allocation (a
// container's devices of one resource), behind the Store interface, so that
// the way they are written can change (a journal of changes beside a
// compacted snapshot) without touching the manager.
//
// Checkpoint is today's Store: the whole state in one file,
// <root>/device-plugins/nodeplug_checkpoint, rewritten atomically on every
// commit; each record keeps its encoding until it changes, so a write
// re-encodes only what changed. It never touches the kubelet's
// kubelet_internal_checkpoint.
package store

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// Store makes the devicemanager's state durable.
//
// Ordering: changes take effect in the order of the Commit calls. A Commit
// that returns nil has made durable every change committed so far, its own
// and those of earlier calls. A Commit that fails leaves its changes applied
// but not durable: the next Commit, even with an empty Batch, makes them
// durable with its own.
//
// Thread safety: every method is safe for concurrent use; Commit calls are
// serialised. Load is called once, before the first Commit.
type Store interface {
	// Location names where the state is kept, for logs.
	Location() string
	// Load returns the saved state, or nil when nothing was saved. Saved
	// state that cannot be trusted is moved aside, never overwritten: Load
	// then returns nil and a *CorruptError (errors.Is ErrCorrupt), after
	// which the caller starts empty and says so loudly. Any other error
	// means the state could neither be read nor moved aside.
	Load() (*Data, error)
	// Commit applies the changes of b and makes them durable.
	Commit(b Batch) error
	// Flush makes sure the saved state is complete and current, writing it
	// when this Store has not written it yet or a Commit failed since. It
	// is called at shutdown.
	Flush() error
}

// AllocationKey names an allocation: one container's devices of one
// resource.
type AllocationKey struct {
	PodUID, ContainerName, ResourceName string
}

// Key returns the allocation's key.
func (a *Allocation) Key() AllocationKey {
	return AllocationKey{a.PodUID, a.ContainerName, a.ResourceName}
}

// Batch is a set of changes. A record is put (replacing the record of the
// same name or key) or removed; a name or key appears at most once.
type Batch struct {
	Resources          []Resource
	RemovedResources   []string
	Allocations        []Allocation
	RemovedAllocations []AllocationKey
}

// Empty reports whether b changes nothing.
func (b *Batch) Empty() bool {
	return len(b.Resources)+len(b.RemovedResources)+len(b.Allocations)+len(b.RemovedAllocations) == 0
}

// CorruptError reports saved state that could not be trusted and was moved
// aside.
type CorruptError struct {
	Path    string // where it was
	MovedTo string // where it is now
	Err     error  // why it was not trusted; wraps ErrCorrupt
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("%s moved aside to %s: %v", e.Path, e.MovedTo, e.Err)
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Checkpoint is a Store that writes the whole state to one file. Each
// record keeps its JSON encoding until it is put again, so a write encodes
// only the records that changed since the last one.
type Checkpoint struct {
	path string

	mu          sync.Mutex
	resources   map[string][]byte
	allocations map[AllocationKey][]byte
	pending     bool // changed since the last successful write
	written     bool // this Checkpoint wrote the file at least once
}

var _ Store = (*Checkpoint)(nil)

// NewCheckpoint returns the Store kept in dir/nodeplug_checkpoint. dir must
// exist.
func NewCheckpoint(dir string) *Checkpoint {
	return &Checkpoint{
		path:        Path(dir),
		resources:   map[string][]byte{},
		allocations: map[AllocationKey][]byte{},
	}
}

// Location implements Store: the checkpoint's path.
func (c *Checkpoint) Location() string { return c.path }

// Load implements Store.
func (c *Checkpoint) Load() (*Data, error) {
	d, err := ReadFile(c.path)
	if err != nil {
		aside, rerr := moveAside(c.path, time.Now())
		if rerr != nil {
			return nil, fmt.Errorf("checkpoint %s is unusable (%v) and could not be moved aside: %w", c.path, err, rerr)
		}
		return nil, &CorruptError{Path: c.path, MovedTo: aside, Err: err}
	}
	if d == nil {
		return nil, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range d.Resources {
		b, err := json.Marshal(&d.Resources[i])
		if err != nil {
			return nil, fmt.Errorf("encode resource %s: %w", d.Resources[i].Name, err)
		}
		c.resources[d.Resources[i].Name] = b
	}
	for i := range d.Allocations {
		b, err := json.Marshal(&d.Allocations[i])
		if err != nil {
			return nil, fmt.Errorf("encode allocation %v: %w", d.Allocations[i].Key(), err)
		}
		c.allocations[d.Allocations[i].Key()] = b
	}
	return d, nil
}

// Commit implements Store. It encodes the records of b, then rewrites the
// file when anything changed or an earlier write failed.
func (c *Checkpoint) Commit(b Batch) error {
	res := make([][]byte, len(b.Resources))
	for i := range b.Resources {
		enc, err := json.Marshal(&b.Resources[i])
		if err != nil {
			return fmt.Errorf("encode resource %s: %w", b.Resources[i].Name, err)
		}
		res[i] = enc
	}
	allocs := make([][]byte, len(b.Allocations))
	for i := range b.Allocations {
		enc, err := json.Marshal(&b.Allocations[i])
		if err != nil {
			return fmt.Errorf("encode allocation %v: %w", b.Allocations[i].Key(), err)
		}
		allocs[i] = enc
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range b.RemovedResources {
		delete(c.resources, name)
	}
	for i, r := range b.Resources {
		c.resources[r.Name] = res[i]
	}
	for _, k := range b.RemovedAllocations {
		delete(c.allocations, k)
	}
	for i := range b.Allocations {
		c.allocations[b.Allocations[i].Key()] = allocs[i]
	}
	if !b.Empty() {
		c.pending = true
	}
	if !c.pending {
		return nil
	}
	return c.writeLocked()
}

// Flush implements Store.
func (c *Checkpoint) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.written && !c.pending {
		return nil
	}
	return c.writeLocked()
}

func (c *Checkpoint) writeLocked() error {
	resources := make([][]byte, 0, len(c.resources))
	for _, name := range slices.Sorted(maps.Keys(c.resources)) {
		resources = append(resources, c.resources[name])
	}
	keys := slices.SortedFunc(maps.Keys(c.allocations), func(a, b AllocationKey) int {
		return strings.Compare(a.PodUID+"\x00"+a.ContainerName+"\x00"+a.ResourceName, b.PodUID+"\x00"+b.ContainerName+"\x00"+b.ResourceName)
	})
	allocations := make([][]byte, 0, len(keys))
	for _, k := range keys {
		allocations = append(allocations, c.allocations[k])
	}
	if err := writeFile(c.path, marshalParts(resources, allocations)); err != nil {
		return err
	}
	c.pending, c.written = false, true
	return nil
}
