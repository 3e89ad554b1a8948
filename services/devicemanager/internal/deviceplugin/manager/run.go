package manager

import (
	"context"
	"time"
)

// persistBatch is how long Run gathers changes before a write they ask for
// with persistSoon.
const persistBatch = 10 * time.Millisecond

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
	var retry <-chan time.Time
	failing := false
	for {
		now := time.Now()
		next, changes, give := m.tick(now)
		if give {
			m.giver.Give("changes", changes)
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
			case <-retry:
				retry = m.write(&failing)
			case <-m.flush:
				// Gather the changes of a burst (many plugins registering
				// at once) into one write.
				select {
				case <-ctx.Done():
				case <-time.After(persistBatch):
				}
				retry = m.write(&failing)
			}
		}
	}
}

// persistRetry is how long Run waits before it writes again after a write
// failed: the changes wait in the store, and devices whose release is not
// durable stay taken until a write works (core_unsaved.go).
const persistRetry = time.Second

// write is Run's write of the state. A failure is logged once, until a
// write works again (logged too), and write returns when to retry.
func (m *Manager) write(failing *bool) <-chan time.Time {
	if err := m.persist(); err != nil {
		if !*failing {
			m.log.Error("writing checkpoint; retrying every "+persistRetry.String()+" until it works", "error", err)
		}
		*failing = true
		return time.After(persistRetry)
	}
	if *failing {
		m.log.Info("checkpoint written again")
	}
	*failing = false
	return nil
}
