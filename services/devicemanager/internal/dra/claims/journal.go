package claims

import (
	"slices"
	"sync"

	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/store"
)

// Journal is the durable store seam: it wraps the devicemanager's Store,
// which the state core (package manager) is given in its place, so that
// the claim records share the allocations' journal and group commit. It
// passes every call through and keeps the claims the core's Load found,
// for the Manager to restore.
type Journal struct {
	store.Store

	mu     sync.Mutex
	loaded bool
	saved  []store.Claim
}

// NewJournal wraps s.
func NewJournal(s store.Store) *Journal { return &Journal{Store: s} }

// Load implements store.Store: the wrapped Store's, its claims kept.
func (j *Journal) Load() (*store.Data, error) {
	d, err := j.Store.Load()
	j.mu.Lock()
	defer j.mu.Unlock()
	j.loaded = true
	if d != nil {
		j.saved = slices.Clone(d.Claims)
	}
	return d, err
}

// Saved returns the claims loaded, and whether Load ran.
func (j *Journal) Saved() ([]store.Claim, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.saved), j.loaded
}

// commit makes the claim records put and removed durable.
func (j *Journal) commit(put []store.Claim, removed []string) error {
	return store.Commit(j.Store, store.Batch{Claims: put, RemovedClaims: removed})
}
