package claims

// This file holds the intents of reservations (store.ClaimIntent). A
// prepare records one for each claim it is about to reserve for its pod,
// before Reserve writes anything to the API; names the claim's UID and
// drivers in it before it calls them; and removes it in the commit that
// records the claim prepared with the pod, or once the rollback is done.
// An intent found at start is what a kill in between left: the claim may
// be allocated and reserved for the pod, its driver may hold it prepared,
// and nothing else says so. It owes what a failed prepare does (undo),
// retried in the background with backoff as an owed unprepare is.

import (
	"context"
	"errors"
	"fmt"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/nodeplug/nodeplug/services/internal/store"
)

// intend records, in one commit, the intents of pod to reserve the claims
// of names; uids are the UIDs known (of claims recorded for other pods).
// It returns their keys.
func (m *Manager) intend(pod PodRef, names []string, uids map[string]string) ([]string, error) {
	keys := make([]string, 0, len(names))
	put := make([]store.Claim, 0, len(names))
	for _, n := range names {
		k := store.IntentKey(pod.UID, pod.Namespace, n)
		keys = append(keys, k)
		put = append(put, store.Claim{UID: k, Namespace: pod.Namespace, Name: n, State: store.ClaimIntent, ClaimUID: uids[n],
			Pods: []store.ClaimPod{{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name}}, Devices: []store.ClaimDevice{}})
	}
	if err := m.commit(put, nil); err != nil {
		return nil, fmt.Errorf("record the intent to reserve claims for pod %s: %w", pod.UID, err)
	}
	return keys, nil
}

// intendCalls records, in one commit, the UIDs and drivers of the fresh
// claims in pod's intents: from then on a restart unprepares them.
func (m *Manager) intendCalls(pod PodRef, fresh []*resourcev1.ResourceClaim) error {
	put := make([]store.Claim, 0, len(fresh))
	for _, obj := range fresh {
		in, ok := m.intent(store.IntentKey(pod.UID, obj.Namespace, obj.Name))
		if !ok {
			return fmt.Errorf("the intent to reserve ResourceClaim %s/%s for pod %s is gone", obj.Namespace, obj.Name, pod.UID)
		}
		in.ClaimUID, in.Drivers = string(obj.UID), claimDrivers(obj)
		if m.cfg.AllocatedHere != nil {
			in.AllocatedHere = m.cfg.AllocatedHere(obj)
		}
		put = append(put, in)
	}
	if err := m.commit(put, nil); err != nil {
		return fmt.Errorf("record the drivers to call for pod %s: %w", pod.UID, err)
	}
	return nil
}

// abandon undoes the intents of keys still recorded: those of the claims
// whose prepare failed. An intent that cannot be undone now is retried in
// the background.
func (m *Manager) abandon(ctx context.Context, keys []string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unreserveTimeout)
	defer cancel()
	for _, k := range keys {
		in, ok := m.intent(k)
		if !ok {
			continue
		}
		if err := m.undo(ctx, in); err != nil {
			m.log.WarnContext(ctx, "claim that failed to prepare not rolled back yet; retrying", "claim", key(in.Namespace, in.Name), "uid", in.ClaimUID, "pod_uid", podOfIntent(in).UID, "error", err)
			m.kick(k)
		}
	}
}

// undo does what an intent owes, as a failed prepare does (the caller
// holds the claim's lock). A driver may hold the claim prepared when the
// intent names drivers — the call's answer was lost, or a kill came
// first — so it is unprepared first (a no-op for a driver that never
// prepared it), unless a record of the claim holds it for other pods or
// owes its unprepare already. Then the pod is removed from the claim's
// reservations, which deallocates a claim this node allocated that no pod
// reserves any longer; a claim whose UID is not known yet is matched by
// the pod's UID in its reservations. Then the intent goes. When the
// driver cannot be reached, the intent is replaced, in one commit, by a
// record owing the unprepare and the removal, as a release's are, so the
// claim keeps its devices until the driver has let go of them.
func (m *Manager) undo(ctx context.Context, in store.Claim) error {
	pod := podOfIntent(in)
	ref := ClaimRef{Namespace: in.Namespace, Name: in.Name, UID: in.ClaimUID}
	if pod.UID == "" {
		m.log.WarnContext(ctx, "intent without a pod dropped", "claim", key(ref.Namespace, ref.Name), "key", in.UID)
		return m.commit(nil, []string{in.UID})
	}
	if len(in.Drivers) > 0 && ref.UID != "" && !m.recorded(ref.UID) {
		if err := m.unprepareNow(ctx, ref, in.Drivers); err != nil {
			return m.oweUnprepare(ctx, in, err)
		}
	}
	if err := m.cfg.Reserver.Unreserve(ctx, PodRef{UID: pod.UID, Namespace: pod.Namespace, Name: pod.Name}, ref); err != nil {
		return fmt.Errorf("unreserve ResourceClaim %s/%s for pod %s: %w", ref.Namespace, ref.Name, pod.UID, err)
	}
	if err := m.commit(nil, []string{in.UID}); err != nil {
		return err
	}
	m.log.InfoContext(ctx, "reservation rolled back", "claim", key(ref.Namespace, ref.Name), "uid", ref.UID, "pod_uid", pod.UID, "unprepared", len(in.Drivers) > 0)
	return nil
}

// oweUnprepare replaces intent in by a record owing the unprepare that
// failed with err, and the removal of the reservation.
func (m *Manager) oweUnprepare(ctx context.Context, in store.Claim, err error) error {
	rec := store.Claim{UID: in.ClaimUID, Namespace: in.Namespace, Name: in.Name, State: store.ClaimUnpreparing,
		Drivers: in.Drivers, Devices: []store.ClaimDevice{}, Released: []store.ClaimPod{podOfIntent(in)}, AllocatedHere: in.AllocatedHere}
	if cerr := m.commit([]store.Claim{rec}, []string{in.UID}); cerr != nil {
		return errors.Join(err, cerr)
	}
	m.log.WarnContext(ctx, "claim that failed to prepare could not be unprepared; retrying", "claim", key(in.Namespace, in.Name), "uid", rec.UID, "error", err)
	m.kick(rec.UID)
	return err
}

// intent returns a copy of the intent of key, if recorded.
func (m *Manager) intent(k string) (store.Claim, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	in, ok := m.intents[k]
	return cloneRec(in), ok
}

func (m *Manager) hasIntent(k string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.intents[k]
	return ok
}

// recorded says whether claim uid is recorded (prepared, or its unprepare
// owed).
func (m *Manager) recorded(uid string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.records[uid] != nil
}

// Intents returns how many intents are recorded: reservations whose
// prepare is neither committed nor rolled back yet (in flight, or owed
// after a failure or a restart).
func (m *Manager) Intents() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.intents)
}

func podOfIntent(in store.Claim) store.ClaimPod {
	if len(in.Pods) == 0 {
		return store.ClaimPod{}
	}
	return in.Pods[0]
}
