package manager

import (
	"context"
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

func (m *Manager) loop(ctx context.Context) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		m.mu.Lock()
		next, removed := m.expireLocked(time.Now())
		m.mu.Unlock()
		if removed {
			m.persistSoon()
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
