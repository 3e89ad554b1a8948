package manager

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/services/devicemanager/internal/store"
)

// Restore loads the saved state and redials the endpoints it records.
// Endpoints still serving are live again at once, with their recorded
// generation, so a later registration of the same generation is a no-op.
// Resources whose endpoints do not answer are kept with every device
// unhealthy until a plugin registers or the grace period ends. Saved state
// that cannot be trusted is moved aside, logged as an error, and the
// manager starts empty. Call Restore once, before serving (Open does).
func (m *Manager) Restore(ctx context.Context) error {
	d, err := m.store.Load()
	if !store.OnlyCorruptions(err) {
		return err
	}
	for _, c := range store.Corruptions(err) {
		msg := "CHECKPOINT UNUSABLE: moved aside; starting with no allocations and no endpoints"
		if d != nil {
			msg = "CHECKPOINT UNUSABLE: moved aside; starting with what preceded the damage"
		}
		m.log.Error(msg, "path", c.Path, "moved_to", c.MovedTo, "also_moved", c.Also, "error", c.Err)
	}
	if d == nil {
		if err == nil {
			m.log.Info("no checkpoint; starting empty", "path", m.store.Location())
		}
		return nil
	}
	now := time.Now()
	restored := m.load(d, now)
	m.log.Info("checkpoint restored", "path", m.store.Location(), "resources", len(d.Resources), "endpoints", len(restored), "allocations", len(d.Allocations))

	var wg sync.WaitGroup
	for _, old := range restored {
		wg.Go(func() { m.redial(ctx, old) })
	}
	wg.Wait()

	m.settleRestored(now)
	return m.persist()
}

// redial reconnects an endpoint recorded in the saved state.
func (m *Manager) redial(ctx context.Context, old *entry) {
	ctx, span := tracer.Start(ctx, "redial "+old.resource, trace.WithNewRoot())
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, redialTimeout)
	defer cancel()
	dialPath, id, err := m.confiner.Identify(old.path)
	if err != nil {
		m.log.InfoContext(ctx, "recorded endpoint not redialled", "resource", old.resource, "endpoint", old.path, "error", err)
		return
	}
	e := &entry{
		resource: old.resource, path: old.path, dialPath: dialPath, id: id, socketPath: old.socketPath,
		generation: old.generation, regPath: old.regPath, versions: old.versions, registered: old.registered,
	}
	unlock := m.regLocks.Lock(e.path)
	defer unlock()
	if err := m.connect(ctx, e); err != nil {
		m.log.InfoContext(ctx, "recorded endpoint does not answer; waiting for its plugin to register again",
			"resource", old.resource, "endpoint", old.path, "dial_path", dialPath, "error", err)
		return
	}
	if _, err := m.install(e); err != nil {
		m.log.WarnContext(ctx, "recorded endpoint not restored", "resource", e.resource, "endpoint", e.path, "dial_path", e.dialPath, "error", err)
		return
	}
	m.log.InfoContext(ctx, "recorded endpoint live again", "resource", e.resource, "endpoint", e.path, "dial_path", e.dialPath, "generation", e.generation)
}
