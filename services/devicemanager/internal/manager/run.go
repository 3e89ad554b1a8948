package manager

import (
	"context"
	"runtime/debug"
	"time"
)

// persistBatch is how long Run gathers changes before a write they ask for
// with persistSoon.
const persistBatch = 10 * time.Millisecond

// persistSoon asks Run to write the state. Device updates, stopped
// endpoints, deregistrations and expiries use it, so they never wait for
// the disk: writes are gathered, and a registration, an Allocate or a
// Release (which write before they return) or Close writes everything
// pending too.
func (m *Manager) persistSoon() {
	select {
	case m.flush <- struct{}{}:
	default:
	}
}

func (m *Manager) poke() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// Run removes resources whose grace period ended and writes the state when
// changes ask for it, until ctx ends; then it closes the manager (see
// Close) and returns Close's error. Call it once.
func (m *Manager) Run(ctx context.Context) error {
	m.loop(ctx)
	return m.Close()
}

// After a burst of at least giveBackMin resources left, once no more
// left for giveBackQuiet, the memory they took is returned to the OS
// (DESIGN "Bounds": memory taken by a burst is given back once the burst
// is gone). Without it the Go runtime keeps it until a GC that may come
// minutes later, since an idle devicemanager allocates nothing.
const (
	giveBackMin   = 64
	giveBackQuiet = time.Second
)

func (m *Manager) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	giveBack := time.NewTimer(time.Hour)
	giveBack.Stop()
	defer giveBack.Stop()
	left := 0 // resources removed since memory was last given back
	for {
		m.mu.Lock()
		before := len(m.resources)
		next, removed := m.expireLocked(time.Now())
		gone := before - len(m.resources)
		m.mu.Unlock()
		if removed {
			m.persistSoon()
		}
		if left += gone; gone > 0 && left >= giveBackMin {
			giveBack.Reset(giveBackQuiet)
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), time.Millisecond)
		}
		timer.Reset(wait)
	writes:
		for {
			select {
			case <-ctx.Done():
				return
			case <-m.wake:
				break writes
			case <-timer.C:
				break writes
			case <-giveBack.C:
				m.log.Debug("returning the memory of resources that left to the OS", "resources", left)
				left = 0
				debug.FreeOSMemory()
			case <-m.flush:
				// Gather the changes of a burst (many plugins registering
				// at once) into one write.
				select {
				case <-ctx.Done():
				case <-time.After(persistBatch):
				}
				if err := m.persist(); err != nil {
					m.log.Error("writing checkpoint", "error", err)
				}
			}
		}
	}
}

// expireLocked removes resources whose grace period ended and returns the
// next deadline.
func (m *Manager) expireLocked(now time.Time) (next time.Time, removed bool) {
	for name, res := range m.resources {
		if res.stoppedAt.IsZero() {
			continue
		}
		deadline := res.stoppedAt.Add(m.grace)
		if !now.Before(deadline) {
			m.log.Info("resource removed: grace period ended with no live endpoint", "resource", name)
			delete(m.resources, name)
			m.dirty[name] = true
			m.metrics.forget(name)
			m.publishLocked(true, m.viewLocked(res))
			removed = true
			continue
		}
		if next.IsZero() || deadline.Before(next) {
			next = deadline
		}
	}
	return next, removed
}
