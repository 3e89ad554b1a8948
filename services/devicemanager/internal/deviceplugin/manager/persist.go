package manager

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/services/internal/store"
)

// Restore loads the saved state and redials the endpoints it records.
// Endpoints still serving are live again at once, with their recorded
// generation, so a later registration of the same generation is a no-op.
// Resources whose endpoints do not answer are kept with every device
// unhealthy until a plugin registers or the grace period ends. Saved state
// that cannot be trusted is moved aside, logged as an error, and the
// manager starts empty; a journal damaged inside is moved aside too, but
// every valid record in it is kept, and the damage named (logGaps). Call
// Restore once, before serving (Open does).
func (m *Manager) Restore(ctx context.Context) error {
	d, err := m.store.Load()
	if !store.OnlyCorruptions(err) {
		return err
	}
	for _, c := range store.Corruptions(err) {
		if len(c.Gaps) > 0 {
			m.logGaps(c)
			continue
		}
		msg := "CHECKPOINT UNUSABLE: moved aside; starting with no allocations and no endpoints"
		if d != nil {
			msg = "CHECKPOINT UNUSABLE: moved aside; starting with the rest of the saved state"
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

// gapsRecovered is what a state recovered around damage in the journal
// holds: see store.Gap.
const gapsRecovered = "every record after the damage was replayed: what it changed is as acknowledged. " +
	"What was last changed inside the damage is as the change before it left it: an allocation made there is missing " +
	"and its devices may be given again, a release made there is undone (its devices look held), a registration or a DRA claim's " +
	"change made there is missing; a release after the damage of an allocation made inside it removes nothing. Check the pods and claims named"

// logGaps says, in one loud line, that a journal damaged inside was moved
// aside and its valid records kept: where each unreadable span is, what
// its surviving bytes name, and the releases after it that found nothing
// to release.
func (m *Manager) logGaps(c *store.CorruptError) {
	var spans, pods, devices, unmatched, claims, resources []string
	seen := map[string]bool{}
	for _, g := range c.Gaps {
		spans = append(spans, g.String())
		claims = append(claims, g.Named.Claims...)
		resources = append(resources, g.Named.Resources...)
		for _, uid := range g.Unmatched.Claims {
			unmatched = append(unmatched, "claim "+uid)
		}
		for _, uid := range g.Pods() {
			if !seen[uid] {
				seen[uid] = true
				pods = append(pods, uid)
			}
		}
		for _, a := range g.Named.Allocations {
			if len(a.DeviceIDs) > 0 {
				devices = append(devices, fmt.Sprintf("%s %v (pod %s)", a.ResourceName, a.DeviceIDs, a.PodUID))
			}
		}
		for _, k := range g.Unmatched.Allocations {
			unmatched = append(unmatched, fmt.Sprintf("pod %s container %s resource %s", k.PodUID, k.ContainerName, k.ResourceName))
		}
	}
	m.log.Error("CHECKPOINT UNUSABLE: journal damaged inside, moved aside; every readable record recovered, "+
		"the changes in its unreadable bytes are unknown",
		"path", c.Path, "moved_to", c.MovedTo, "also_moved", c.Also, "unreadable", spans,
		"pods_named", pods, "devices_named", devices, "claims_named", claims, "resources_named", resources,
		"released_after_damage", unmatched,
		"recovered", gapsRecovered, "error", c.Err)
}
