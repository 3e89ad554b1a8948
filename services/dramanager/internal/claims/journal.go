package claims

import (
	"errors"
	"slices"
	"sync"

	"github.com/nodeplug/nodeplug/services/internal/store"
)

// Journal is the durable store seam: it wraps the dramanager's Store (a
// journal of its own, apart from the devicemanager's allocations). It
// passes every call through and keeps the claims Load found, for the
// Manager to restore.
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

// Import records claims (an older devicemanager's records) in a journal
// that was loaded and held nothing, before New: the Manager restores them
// as if loaded.
func (j *Journal) Import(claims []store.Claim) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if !j.loaded || len(j.saved) > 0 {
		return errors.New("claims: import into a journal that is not loaded, or not empty")
	}
	if err := j.commit(claims, nil); err != nil {
		return err
	}
	j.saved = slices.Clone(claims)
	return nil
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
