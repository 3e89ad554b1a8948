package claimview

import (
	"fmt"
	"testing"
)

// Past maxFailures the oldest failure is forgotten, never another: which
// claims are failed does not depend on a map's order. The latest failure
// of a claim is the one shown; a pod's release forgets only that pod's.
func TestFailuresForgetTheOldestFirst(t *testing.T) {
	var f failures
	for i := range maxFailures + 10 {
		f.set(fmt.Sprintf("ns/c%d", i), "pod", "uid", fmt.Sprintf("failure %d", i))
	}
	for i := range maxFailures + 10 {
		_, ok := f.get(fmt.Sprintf("ns/c%d", i), "uid")
		if want := i >= 10; ok != want {
			t.Errorf("claim c%d remembered: %v, want %v", i, ok, want)
		}
	}
	if f.n != maxFailures {
		t.Errorf("%d failures remembered, want %d", f.n, maxFailures)
	}

	f = failures{}
	f.set("ns/a", "p1", "uid-a", "first")
	f.set("ns/a", "p2", "uid-a", "second")
	if why, _ := f.get("ns/a", "uid-a"); why != "second" {
		t.Errorf("failure of a = %q, want the latest, second", why)
	}
	if _, ok := f.get("ns/a", "uid-other"); ok {
		t.Error("a claim of another UID under a's name is failed")
	}
	f.forgetPod("p2")
	if why, _ := f.get("ns/a", "uid-a"); why != "first" {
		t.Errorf("failure of a after p2's release = %q, want p1's, first", why)
	}
	f.forgetPod("p1")
	if _, ok := f.get("ns/a", "uid-a"); ok || f.n != 0 || len(f.m) != 0 {
		t.Errorf("after both releases: failed %v, %d entries, %d claims; want none", ok, f.n, len(f.m))
	}
}

// A list forgets the failures of claims it does not find (or finds under
// another UID), in its namespace, set before it began; one set after is
// kept (the list may predate the claim).
func TestFailuresPrune(t *testing.T) {
	var f failures
	f.set("ns/gone", "p", "u1", "x")
	f.set("ns/recreated", "p", "u2", "x")
	f.set("ns/kept", "p", "u3", "x")
	f.set("ns/unknown-uid", "p", "", "x")
	f.set("other/gone", "p", "u4", "x")
	since := f.mark()
	f.set("ns/late", "p", "u5", "x")
	f.prune("ns", map[string]string{"ns/recreated": "u2-new", "ns/kept": "u3", "ns/unknown-uid": "u6"}, since)
	for claim, want := range map[string]bool{
		"ns/gone": false, "ns/recreated": false, "ns/kept": true, "ns/unknown-uid": true, "other/gone": true, "ns/late": true,
	} {
		if kept := f.m[claim] != nil; kept != want {
			t.Errorf("%s remembered after the prune: %v, want %v", claim, kept, want)
		}
	}
	if f.n != 4 {
		t.Errorf("%d failures remembered after the prune, want 4", f.n)
	}
}
