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
		now := time.Now()
		m.mu.Lock()
		next, removed := m.expireLocked(now)
		changes, give := m.burst.take(now)
		if at, ok := m.burst.due(); ok && (next.IsZero() || at.Before(next)) {
			next = at
		}
		if give {
			m.compactLocked()
		}
		m.mu.Unlock()
		if removed {
			m.persistSoon()
		}
		if give {
			m.giveBack(changes)
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

// changesLocked records n endpoint arrivals, departures or resource
// removals at now for the give-back (see GiveBack), and wakes Run when
// they make a burst.
func (m *Manager) changesLocked(now time.Time, n int) {
	if m.burst.changed(now, n) {
		m.poke()
	}
}

// giveBack returns to the OS the memory that a settled burst of changes
// freed (see GiveBack).
func (m *Manager) giveBack(changes int) {
	start := time.Now()
	before, after := m.freeMemory()
	var returned uint64
	if before > after {
		returned = before - after
	}
	m.metrics.givenBack.Inc()
	m.metrics.givenBackBytes.Add(float64(returned))
	m.log.Debug("a burst of endpoint changes settled: memory returned to the OS", "changes", changes,
		"returned_bytes", returned, "retained_bytes", after, "took", time.Since(start))
}

// compactLocked rebuilds the manager's maps, sized to what they hold now:
// a Go map never shrinks, so after a burst of departures they would keep
// the room of every plugin that left.
func (m *Manager) compactLocked() {
	m.resources = rebuilt(m.resources)
	m.live = rebuilt(m.live)
	m.dirty = rebuilt(m.dirty)
}

func rebuilt[K comparable, V any](in map[K]V) map[K]V {
	out := make(map[K]V, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
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
			m.publishLocked(Change{Removed: true, Resource: m.viewLocked(res)})
			m.changesLocked(now, 1)
			removed = true
			continue
		}
		if next.IsZero() || deadline.Before(next) {
			next = deadline
		}
	}
	return next, removed
}
