// Package store keeps the managers' state durable: the devicemanager's,
// one record per resource (its devices and endpoints) and one per
// allocation (a container's devices of one resource), and the
// dramanager's, one record per prepared DRA claim or intent (claims.go),
// behind the Store interface. Each manager has a journal of its own.
//
// Journal is the Store: in its directory (the devicemanager's
// device-plugins directory, the dramanager's dra-manager), a snapshot of the
// whole state (nodeplug_checkpoint) and, beside it, an append-only journal
// of the changes since (nodeplug_checkpoint.journal.<N>), each change one
// checksummed record. A change costs one append, and every change that
// arrives while a sync is in flight shares the next one (group commit), so
// the cost of making a change durable does not grow with the state. The
// snapshot is rewritten in the background once the journal has grown
// past the snapshot's size, and the journal starts anew. Recovery reads
// the snapshot, then the journal. KubeletMirror wraps a Store to keep a
// mirror of the state in the kubelet's own checkpoint format
// (kubelet_internal_checkpoint, for the tools that read it), written in the
// background, and to import a kubelet's allocations at a first start.
//
// The files: store.go (the Store interface, its changes and errors),
// checkpoint.go (the state and the snapshot's format), record.go (the
// journal's format), journal.go (the Journal: appends, group commit and
// compaction, which share its one lock and its state: a compaction
// switches the file that appends and syncs write to), load.go (Load, in
// phases: the snapshot, the journals, replay, and the fresh start that
// also migrates an older-format checkpoint; it recovers from a compaction
// stopped at any of its steps), frames.go (finding every valid record of
// a damaged journal: torn writes, damage, resynchronising past it),
// gaps.go (the damage Load passed over, what it names, and what the state
// recovered around it means), kubelet.go (the kubelet's checkpoint format
// and checksum) and mirror.go (the KubeletMirror).
package store

import (
	"errors"
	"fmt"
	"strings"
)

// Store makes a manager's state durable.
//
// Ordering: changes take effect in the order of the Append calls. Wait(t)
// returns nil once every change appended up to t, and every change
// appended before it, is durable. A failed Wait leaves the changes applied
// but not durable: a later Wait makes them durable with its own.
//
// Thread safety: every method is safe for concurrent use. Load is called
// once, before the first Append. Callers that need their changes to be
// staged in the same order as they are appended serialise their Append
// calls themselves, and wait outside that lock so that their waits share
// one sync.
type Store interface {
	// Location names where the state is kept, for logs.
	Location() string
	// Load returns the saved state, or nil when nothing was saved. Saved
	// state that cannot be trusted is moved aside, never overwritten: the
	// error then holds one *CorruptError per file moved aside (see
	// Corruptions; errors.Is ErrCorrupt), and the Data, when not nil, is
	// what could be kept. Any other error means the state could neither be
	// read nor moved aside.
	Load() (*Data, error)
	// Append applies the changes of b and queues them to be made durable.
	// It does not wait for the disk.
	Append(b Batch) (Ticket, error)
	// Wait blocks until every change appended up to t is durable.
	Wait(t Ticket) error
	// Flush makes every change durable, waits for a compaction in flight,
	// and closes the files; the Store takes no change after it. It is
	// called at shutdown.
	Flush() error
}

// Ticket names a point in the sequence of appended changes.
type Ticket uint64

// Commit appends b to s and waits until it is durable.
func Commit(s Store, b Batch) error {
	t, err := s.Append(b)
	if err != nil {
		return err
	}
	return s.Wait(t)
}

// AllocationKey names an allocation: one container's devices of one
// resource.
type AllocationKey struct {
	PodUID        string `json:"pod_uid"`
	ContainerName string `json:"container_name"`
	ResourceName  string `json:"resource_name"`
}

func (k AllocationKey) compare(o AllocationKey) int {
	if c := strings.Compare(k.PodUID, o.PodUID); c != 0 {
		return c
	}
	if c := strings.Compare(k.ContainerName, o.ContainerName); c != 0 {
		return c
	}
	return strings.Compare(k.ResourceName, o.ResourceName)
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
	// Claims are prepared DRA claims (claims.go), by UID.
	Claims        []Claim
	RemovedClaims []string
}

// Empty reports whether b changes nothing.
func (b *Batch) Empty() bool {
	return len(b.Resources)+len(b.RemovedResources)+len(b.Allocations)+len(b.RemovedAllocations)+len(b.Claims)+len(b.RemovedClaims) == 0
}

// CorruptError reports a saved file that could not be trusted and was
// moved aside.
type CorruptError struct {
	Path    string // where it was
	MovedTo string // where it is now
	Err     error  // why it was not trusted; wraps ErrCorrupt
	// Also lists files moved aside with it, because they only make sense
	// on top of it (the journal of a corrupt snapshot).
	Also []string
	// Gaps, for a journal, are its spans that could not be read; the
	// valid records around them were kept (see Gap).
	Gaps []*Gap
}

func (e *CorruptError) Error() string {
	s := fmt.Sprintf("%s moved aside to %s: %v", e.Path, e.MovedTo, e.Err)
	if len(e.Also) > 0 {
		s += fmt.Sprintf(" (moved aside with it: %s)", strings.Join(e.Also, ", "))
	}
	for _, g := range e.Gaps {
		s += "; " + g.String()
	}
	return s
}

func (e *CorruptError) Unwrap() error { return e.Err }

// Corruptions returns every *CorruptError in err, which may join several.
func Corruptions(err error) []*CorruptError {
	var out []*CorruptError
	var walk func(error)
	walk = func(err error) {
		if ce, ok := err.(*CorruptError); ok {
			out = append(out, ce)
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

// OnlyCorruptions reports whether err is nothing but files moved aside.
func OnlyCorruptions(err error) bool {
	if err == nil {
		return true
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !OnlyCorruptions(e) {
				return false
			}
		}
		return true
	}
	var ce *CorruptError
	return errors.As(err, &ce) && ce == err
}
