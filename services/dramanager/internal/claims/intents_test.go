package claims_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// intentOf is the intent of pod to reserve claim, as a prepare records
// it; uid and drivers as known at the step it stands for.
func intentOf(pod, claim, uid string, drivers ...string) store.Claim {
	return store.Claim{UID: store.IntentKey("uid-"+pod, ns, claim), Namespace: ns, Name: claim, State: store.ClaimIntent,
		ClaimUID: uid, Drivers: drivers, Devices: []store.ClaimDevice{}, AllocatedHere: len(drivers) > 0,
		Pods: []store.ClaimPod{{UID: "uid-" + pod, Namespace: ns, Name: pod}}}
}

// killWith records intents durably, as a prepare does before the step it
// is killed at, and crashes: what the API and the driver hold was done by
// the caller.
func (e *env) killWith(intents ...store.Claim) {
	e.t.Helper()
	if err := store.Commit(e.journal, store.Batch{Claims: intents}); err != nil {
		e.t.Fatal(err)
	}
	e.crash()
}

func (e *env) reserve(pod, claim string) string {
	e.t.Helper()
	obj, err := e.res.Reserve(ctx, claims.PodRef{UID: "uid-" + pod, Namespace: ns, Name: pod}, claims.ClaimRef{Namespace: ns, Name: claim})
	if err != nil {
		e.t.Fatal(err)
	}
	return string(obj.UID)
}

// waitSettled waits until no intent is left and claim has neither an
// allocation, nor a reservation, nor the allocation marker.
func (e *env) waitSettled(claim string) {
	e.t.Helper()
	testutil.Eventually(e.t, claim+" rolled back", func() error {
		c := e.get(claim)
		if n := e.mgr.Intents(); n != 0 || c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 || c.Annotations[claimalloc.AllocatedByAnnotation] != "" {
			return fmt.Errorf("%d intents; claim status %+v, annotations %v", n, c.Status, c.Annotations)
		}
		return nil
	})
}

// TestIntentRolledBackAtStart: a kill at each step of a prepare between
// its intent and its commit leaves an intent; the next start rolls the
// claim back (unprepared only when the driver may hold it) and forgets
// the intent. A claim other pods hold keeps them and stays prepared.
func TestIntentRolledBackAtStart(t *testing.T) {
	for _, tc := range []struct {
		name       string
		step       func(e *env) store.Claim
		unprepares int
	}{
		{"before Reserve", func(*env) store.Claim { return intentOf("p1", "one", "") }, 0},
		{"marker written", func(e *env) store.Claim {
			c := e.get("one")
			c.Annotations = map[string]string{claimalloc.AllocatedByAnnotation: dratest.Node}
			if _, err := e.api.Client.ResourceV1().ResourceClaims(ns).Update(ctx, c, metav1.UpdateOptions{}); err != nil {
				e.t.Fatal(err)
			}
			return intentOf("p1", "one", "")
		}, 0},
		{"reserved, UID not recorded", func(e *env) store.Claim {
			e.reserve("p1", "one")
			return intentOf("p1", "one", "")
		}, 0},
		{"driver called", func(e *env) store.Claim {
			uid := e.reserve("p1", "one")
			if _, err := e.reg.Prepare(ctx, driverName, []claims.ClaimRef{{Namespace: ns, Name: "one", UID: uid}}); err != nil {
				e.t.Fatal(err)
			}
			return intentOf("p1", "one", uid, driverName)
		}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			e.claim("one", "gpu")
			e.killWith(tc.step(e))
			e.start()
			e.waitSettled("one")
			if _, u := e.plugin.counts("one"); u != tc.unprepares {
				t.Fatalf("%d unprepares, want %d", u, tc.unprepares)
			}
			if l := e.mgr.List(); len(l) != 0 {
				t.Fatalf("recorded: %+v", l)
			}
		})
	}
}

// TestIntentOfSharedClaim: a pod killed while being added to a claim
// another pod holds prepared is removed from its reservations; the other
// pod keeps the claim, prepared and allocated.
func TestIntentOfSharedClaim(t *testing.T) {
	e := newEnv(t)
	e.claim("shared", "gpu")
	e.prepare(podReq("p1", "shared"))
	uid := e.reserve("p2", "shared")
	e.killWith(intentOf("p2", "shared", uid))
	e.start()
	testutil.Eventually(t, "p2's reservation removed", func() error {
		if got := reservedFor(e, "shared"); e.mgr.Intents() != 0 || !slices.Equal(got, []string{"uid-p1"}) {
			return fmt.Errorf("%d intents, reserved for %v", e.mgr.Intents(), got)
		}
		return nil
	})
	if p, u := e.plugin.counts("shared"); p != 1 || u != 0 || e.get("shared").Status.Allocation == nil {
		t.Fatalf("%d prepares, %d unprepares, status %+v", p, u, e.get("shared").Status)
	}
	if l := e.mgr.List(); len(l) != 1 || l[0].State != claims.StatePrepared || !slices.Equal(l[0].Pods, []string{"uid-p1"}) {
		t.Fatalf("recorded: %+v", l)
	}
}

// TestIntentRetriedWhileDriverDown: a rollback owed at start whose driver
// cannot unprepare becomes an owed unprepare, retried until the driver
// can; only then does the claim lose its reservation and allocation.
func TestIntentRetriedWhileDriverDown(t *testing.T) {
	e := newEnv(t)
	e.claim("one", "gpu")
	uid := e.reserve("p1", "one")
	if _, err := e.reg.Prepare(ctx, driverName, []claims.ClaimRef{{Namespace: ns, Name: "one", UID: uid}}); err != nil {
		t.Fatal(err)
	}
	e.plugin.set(func(p *plugin) { p.unprepareFails = 3 })
	e.killWith(intentOf("p1", "one", uid, driverName))
	e.start()
	e.waitSettled("one")
	if _, u := e.plugin.counts("one"); u != 4 {
		t.Fatalf("%d unprepares, want 3 failed and 1 done", u)
	}
	e.waitGone("one")
}

// TestPrepareTakesOverIntent: the same pod prepared again after a kill
// left its intent is prepared: the earlier attempt rolled back first
// (by the start, or by the prepare, whichever comes first), no intent
// left, the claim reserved for the pod alone.
func TestPrepareTakesOverIntent(t *testing.T) {
	e := newEnv(t)
	e.claim("one", "gpu")
	uid := e.reserve("p1", "one")
	if _, err := e.reg.Prepare(ctx, driverName, []claims.ClaimRef{{Namespace: ns, Name: "one", UID: uid}}); err != nil {
		t.Fatal(err)
	}
	e.killWith(intentOf("p1", "one", uid, driverName))
	e.start()
	e.prepare(podReq("p1", "one"))
	if p, u := e.plugin.counts("one"); p != 2 || u != 1 || e.mgr.Intents() != 0 {
		t.Fatalf("%d prepares, %d unprepares, %d intents", p, u, e.mgr.Intents())
	}
	if got := reservedFor(e, "one"); !slices.Equal(got, []string{"uid-p1"}) {
		t.Fatalf("reserved for %v", got)
	}
	e.release("p1", 1)
	e.waitGone("one")
}

// TestPrepareRunsOwedRollback: a prepare retried while the unprepare its
// failed predecessor's rollback owes waits out its backoff runs that
// unprepare now and succeeds, rather than being refused.
func TestPrepareRunsOwedRollback(t *testing.T) {
	e := newEnv(t)
	e.stop()
	e.retry = time.Hour // the owed unprepare's retry never comes in this test
	e.start()
	e.claim("one", "gpu")
	e.plugin.set(func(p *plugin) { p.failPrepare["one"], p.unprepareFails = "driver restarting", 1 })
	if _, err := e.mgr.Prepare(ctx, podReq("p1", "one")); err == nil {
		t.Fatal("prepare succeeded")
	}
	if l := e.mgr.List(); len(l) != 1 || l[0].State != claims.StateUnpreparing {
		t.Fatalf("after the failed prepare: %+v", l)
	}
	e.plugin.set(func(p *plugin) { delete(p.failPrepare, "one") })
	out, err := e.mgr.Prepare(ctx, podReq("p1", "one"))
	if err != nil || len(out[0].CDIDeviceIDs) != 1 {
		t.Fatalf("retried prepare: %+v, %v", out, err)
	}
	if p, u := e.plugin.counts("one"); p != 2 || u != 2 {
		t.Fatalf("%d prepares, %d unprepares; want 2 and 2 (the owed one run by the retry)", p, u)
	}
	if l := e.mgr.List(); len(l) != 1 || l[0].State != claims.StatePrepared || e.mgr.Intents() != 0 {
		t.Fatalf("after the retry: %+v, %d intents", l, e.mgr.Intents())
	}
	if got := reservedFor(e, "one"); !slices.Equal(got, []string{"uid-p1"}) {
		t.Fatalf("reserved for %v", got)
	}
}

// TestFailedReserveLeavesNoIntent: a prepare whose Reserve fails (no
// device for the claim) leaves neither an intent nor a reservation.
func TestFailedReserveLeavesNoIntent(t *testing.T) {
	e := newEnv(t)
	e.claim("big", "a", "b", "c", "d", "e")
	_, err := e.mgr.Prepare(ctx, podReq("p1", "big"))
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("prepare of a claim for more devices than there are: %v", err)
	}
	e.waitSettled("big")
}
