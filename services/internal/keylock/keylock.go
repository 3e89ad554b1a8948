// Package keylock serialises work per key: callers that lock the same key
// run one at a time, callers with different keys never wait for each other.
// The devicemanager uses it for registrations (per endpoint path) and for
// allocations (per pod and container).
package keylock

import "sync"

// Mutex is a set of mutexes, one per key, created on first use and dropped
// once nobody holds or waits for it. The zero value is ready to use and is
// safe for concurrent use. It is not reentrant: locking a key twice from one
// goroutine deadlocks. Waiters on one key are not ordered.
type Mutex struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	mu   sync.Mutex
	refs int
}

// Lock locks key and returns its unlock function, to be called once.
func (k *Mutex) Lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*entry{}
	}
	e := k.m[key]
	if e == nil {
		e = &entry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// held returns the number of keys locked or waited for.
func (k *Mutex) held() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
