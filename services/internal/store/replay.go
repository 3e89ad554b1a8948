// This file applies changes to the state: an encoded batch as it is
// appended, a journal record as it is replayed.

package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
)

// apply applies an encoded batch to s.
func (s *state) apply(e *encodedBatch) {
	for _, name := range e.b.RemovedResources {
		delete(s.resources, name)
	}
	for i := range e.b.Resources {
		s.resources[e.b.Resources[i].Name] = e.resources[i]
	}
	for _, k := range e.b.RemovedAllocations {
		delete(s.allocations, k)
	}
	for i := range e.b.Allocations {
		s.allocations[e.b.Allocations[i].Key()] = e.allocations[i]
	}
	for _, uid := range e.b.RemovedClaims {
		delete(s.claims, uid)
	}
	for i := range e.b.Claims {
		s.claims[e.b.Claims[i].UID] = e.claims[i]
	}
}

// replay applies one journal record's payload to s. Errors wrap
// ErrCorrupt.
func (s *state) replay(payload []byte) error {
	_, err := s.replayNoting(payload)
	return err
}

// unmatched are the removals of a record that found nothing to remove:
// after damage in a journal, the trace of a put the damage took (see Gap).
type unmatched struct {
	allocations []AllocationKey
	resources   []string
	claims      []string
}

// replayNoting is replay, and returns the record's removals that found
// nothing to remove.
func (s *state) replayNoting(payload []byte) (unmatched, error) {
	var r record
	var u unmatched
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return u, fmt.Errorf("%w: journal record: %v", ErrCorrupt, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return u, fmt.Errorf("%w: data after a journal record", ErrCorrupt)
	}
	// Check every record before changing anything, so that a record is
	// applied whole or not at all.
	staged := newState()
	for _, raw := range r.Resources {
		if err := staged.putResource(raw); err != nil {
			return u, err
		}
	}
	for _, raw := range r.Allocations {
		if err := staged.putAllocation(raw); err != nil {
			return u, err
		}
	}
	for _, raw := range r.Claims {
		if err := staged.putClaim(raw); err != nil {
			return u, err
		}
	}
	u.resources = removeAll(s.resources, r.RemovedResources)
	u.allocations = removeAll(s.allocations, r.RemovedAllocations)
	maps.Copy(s.resources, staged.resources)
	u.claims = removeAll(s.claims, r.RemovedClaims)
	maps.Copy(s.allocations, staged.allocations)
	maps.Copy(s.claims, staged.claims)
	return u, nil
}

// removeAll removes keys from m and returns those it did not hold.
func removeAll[K comparable, V any](m map[K]V, keys []K) []K {
	var absent []K
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			absent = append(absent, k)
			continue
		}
		delete(m, k)
	}
	return absent
}
