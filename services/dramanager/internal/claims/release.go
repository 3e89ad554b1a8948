package claims

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/services/internal/store"
)

// ReleasePod drops the pod from every claim it uses and returns how many.
// Each change is durable before it returns: a claim other pods still use
// keeps them, one with no pod left is recorded as unpreparing. The rest
// is owed work, done in the background and retried with backoff until it
// succeeds, across restarts: NodeUnprepareResources for an unpreparing
// claim, then removing the pod from the claim's status.reservedFor
// (Reserver.Unreserve, which deallocates a claim this node allocated once
// no pod reserves it), then dropping the record. Releasing a pod that
// uses no claim releases none.
func (m *Manager) ReleasePod(ctx context.Context, podUID string) (int, error) {
	var uids []string
	m.mu.Lock()
	for uid, r := range m.records {
		if hasPod(r.rec.Pods, podUID) {
			uids = append(uids, uid)
		}
	}
	m.mu.Unlock()
	slices.Sort(uids)
	released := 0
	var errs []error
	for _, uid := range uids {
		ok, err := m.releaseClaim(ctx, uid, podUID)
		if err != nil {
			errs = append(errs, err)
		}
		if ok {
			released++
		}
	}
	return released, errors.Join(errs...)
}

// releaseClaim drops pod from the claim uid, durably.
func (m *Manager) releaseClaim(ctx context.Context, uid, podUID string) (bool, error) {
	name, ok := m.nameOf(uid)
	if !ok {
		return false, nil
	}
	unlock := m.locks.Lock(name)
	defer unlock()
	m.mu.Lock()
	r := m.records[uid]
	var rec store.Claim
	if r != nil {
		rec = cloneRec(r.rec)
	}
	m.mu.Unlock()
	i := slices.IndexFunc(rec.Pods, func(p store.ClaimPod) bool { return p.UID == podUID })
	if r == nil || i < 0 {
		return false, nil // released meanwhile
	}
	rec.Released = append(rec.Released, rec.Pods[i])
	rec.Pods = slices.Delete(rec.Pods, i, i+1)
	if len(rec.Pods) == 0 {
		rec.State = store.ClaimUnpreparing
	}
	if err := m.commit([]store.Claim{rec}, nil); err != nil {
		return false, fmt.Errorf("release ResourceClaim %s/%s for pod %s: %w", rec.Namespace, rec.Name, podUID, err)
	}
	m.log.InfoContext(ctx, "claim released by a pod", "claim", key(rec.Namespace, rec.Name), "uid", uid, "pod_uid", podUID,
		"pods_left", len(rec.Pods), "unprepare_owed", rec.State == store.ClaimUnpreparing)
	Crash(CrashReleased)
	m.kick(uid)
	return true, nil
}

// nameOf returns the lock key (namespace/name) of claim uid, or of the
// intent of key uid.
func (m *Manager) nameOf(uid string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if in, ok := m.intents[uid]; ok {
		return key(in.Namespace, in.Name), true
	}
	r := m.records[uid]
	if r == nil {
		return "", false
	}
	return key(r.rec.Namespace, r.rec.Name), true
}

// kick starts the retry loop of claim uid (or of the intent of key uid)
// unless it runs.
func (m *Manager) kick(uid string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.working[uid] || m.ctx.Err() != nil {
		return
	}
	m.working[uid] = true
	m.wg.Add(1)
	go m.work(uid)
}

// work does what claim uid owes until it is done, with backoff between
// failed attempts, or until Close.
func (m *Manager) work(uid string) {
	defer m.wg.Done()
	delay := m.cfg.RetryInitial
	for attempt := 1; ; attempt++ {
		done := m.attempt(uid, attempt)
		if done {
			m.mu.Lock()
			// Work owed after the attempt read the record (a pod released
			// meanwhile) finds working still set: look once more.
			r := m.records[uid]
			_, intent := m.intents[uid]
			more := intent || (r != nil && owes(r.rec))
			if !more {
				delete(m.working, uid)
			}
			m.mu.Unlock()
			if !more {
				return
			}
			continue
		}
		t := time.NewTimer(delay)
		select {
		case <-m.ctx.Done():
			t.Stop()
			m.mu.Lock()
			delete(m.working, uid)
			m.mu.Unlock()
			return
		case <-t.C:
		}
		delay = min(2*delay, m.cfg.RetryMax)
	}
}

func owes(c store.Claim) bool { return c.State == store.ClaimUnpreparing || len(c.Released) > 0 }

// attempt does what claim uid (or the intent of key uid) owes once,
// under its lock (owed). It reports whether nothing is owed any longer.
func (m *Manager) attempt(uid string, n int) bool {
	name, ok := m.nameOf(uid)
	if !ok {
		return true
	}
	unlock := m.locks.Lock(name)
	defer unlock()
	ctx, span := tracer.Start(m.ctx, "unprepare claim "+name, trace.WithNewRoot(), trace.WithAttributes(
		attribute.String("claim.uid", uid), attribute.Int("attempt", n)))
	defer span.End()
	if err := m.owed(ctx, uid); err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		if m.ctx.Err() == nil {
			m.log.WarnContext(ctx, "claim work failed; retrying", "claim", name, "uid", uid, "attempt", n, "error", err)
		}
		return false
	}
	return true
}

// owed does what claim uid owes, or what the intent of key uid does, once;
// the caller holds the claim's lock. For a claim: unprepare it when no pod
// uses it, remove the released pods' reservations, record the result.
func (m *Manager) owed(ctx context.Context, uid string) error {
	m.mu.Lock()
	in, intent := m.intents[uid]
	r := m.records[uid]
	var rec store.Claim
	if r != nil {
		rec = cloneRec(r.rec)
	}
	m.mu.Unlock()
	switch {
	case intent:
		return m.undo(ctx, cloneRec(in))
	case r == nil || !owes(rec):
		return nil
	}
	err := m.settle(ctx, &rec)
	if err != nil {
		m.mu.Lock()
		if r := m.records[uid]; r != nil {
			r.lastError = err.Error()
		}
		m.mu.Unlock()
	}
	return err
}

// settle does rec's owed work and records it.
func (m *Manager) settle(ctx context.Context, rec *store.Claim) error {
	ref := ClaimRef{Namespace: rec.Namespace, Name: rec.Name, UID: rec.UID}
	if rec.State == store.ClaimUnpreparing {
		if err := m.unprepareNow(ctx, ref, rec.Drivers); err != nil {
			return err
		}
		Crash(CrashUnprepared)
	}
	for len(rec.Released) > 0 {
		p := rec.Released[0]
		if err := m.cfg.Reserver.Unreserve(ctx, PodRef{UID: p.UID, Namespace: p.Namespace, Name: p.Name}, ref); err != nil {
			// The unprepare is done but stays recorded as owed: a
			// repeated NodeUnprepareResources is a no-op for a driver.
			return fmt.Errorf("unreserve ResourceClaim %s/%s for pod %s: %w", ref.Namespace, ref.Name, p.UID, err)
		}
		rec.Released = rec.Released[1:]
	}
	if rec.State == store.ClaimUnpreparing {
		if err := m.commit(nil, []string{rec.UID}); err != nil {
			return err
		}
		m.log.InfoContext(ctx, "claim unprepared", "claim", key(ref.Namespace, ref.Name), "uid", ref.UID)
		return nil
	}
	rec.Released = nil
	return m.commit([]store.Claim{*rec}, nil)
}
