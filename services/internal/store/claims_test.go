package store

import (
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

func claimRec(uid string, pods ...string) Claim {
	c := Claim{
		UID: uid, Namespace: "ns", Name: "claim-" + uid, Drivers: []string{"gpu.example.com"}, State: ClaimPrepared,
		Devices: []ClaimDevice{{Requests: []string{"gpu"}, Driver: "gpu.example.com", Pool: "node-1", Device: "gpu-0", CDIDeviceIDs: []string{"example.com/gpu=gpu-0"}}},
		Pods:    []ClaimPod{},
	}
	for _, p := range pods {
		c.Pods = append(c.Pods, ClaimPod{UID: p, Namespace: "ns", Name: "pod-" + p})
	}
	return c
}

// TestClaimsReplayed: claims put, changed and removed reach a restart
// through the journal alone (no compaction), beside allocations of the
// same batches.
func TestClaimsReplayed(t *testing.T) {
	dir := testutil.TempDir(t)
	j, _, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := claimRec("uid-a", "p1"), claimRec("uid-b", "p1", "p2")
	commit(t, j, Batch{Claims: []Claim{a, b}, Allocations: []Allocation{alloc("p1", "example.com/r", "d0")}})
	b.Pods = b.Pods[1:]
	b.Released = []ClaimPod{{UID: "p1", Namespace: "ns", Name: "pod-p1"}}
	commit(t, j, Batch{Claims: []Claim{b}})
	a.State = ClaimUnpreparing
	commit(t, j, Batch{Claims: []Claim{a}})
	c := claimRec("uid-c")
	c.AllocatedHere = true
	commit(t, j, Batch{Claims: []Claim{c}})
	commit(t, j, Batch{RemovedClaims: []string{"uid-c"}})
	crash(j)

	_, d, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []Claim{a, b}; !reflect.DeepEqual(d.Claims, want) {
		t.Fatalf("claims after replay:\n got %+v\nwant %+v", d.Claims, want)
	}
	if len(d.Allocations) != 1 {
		t.Fatalf("allocations after replay: %+v", d.Allocations)
	}
}

// TestClaimsCompacted: the snapshot carries the claims, so they survive
// compactions that drop the journals which put them.
func TestClaimsCompacted(t *testing.T) {
	dir := testutil.TempDir(t)
	h := &journalHooks{}
	j, _, err := open(t, dir, Options{CompactAt: 4 << 10, hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	kept := claimRec("uid-kept", "p0")
	kept.AllocatedHere = true
	commit(t, j, Batch{Claims: []Claim{kept}})
	for i := 0; h.compactions.Load() < 2; i++ {
		c := claimRec(fmt.Sprintf("uid-%d", i), "p")
		commit(t, j, Batch{Claims: []Claim{c}})
		commit(t, j, Batch{RemovedClaims: []string{c.UID}})
		if i > 100000 {
			t.Fatal("no compaction")
		}
	}
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
	snap := mustState(t, dir)
	if !reflect.DeepEqual(snap.Claims, []Claim{kept}) {
		t.Fatalf("state read back: %+v", snap.Claims)
	}
	_, d, err := open(t, dir, Options{})
	if err != nil || !reflect.DeepEqual(d.Claims, []Claim{kept}) {
		t.Fatalf("after compactions: %+v, %v", d, err)
	}
}

// TestOlderFileWithoutClaims: a snapshot and journal of a release before
// claims (no "claims" field anywhere) load with none, and take claims
// from then on.
func TestOlderFileWithoutClaims(t *testing.T) {
	dir := testutil.TempDir(t)
	j, _, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	commit(t, j, Batch{Resources: []Resource{res("example.com/r", "d0")}, Allocations: []Allocation{alloc("p1", "example.com/r", "d0")}})
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	if s := string(b); containsField(s, "claims") {
		t.Fatalf("a state with no claims wrote a claims field: %s", s)
	}
	j2, d, err := open(t, dir, Options{})
	if err != nil || len(d.Claims) != 0 || len(d.Allocations) != 1 {
		t.Fatalf("older file: %+v, %v", d, err)
	}
	commit(t, j2, Batch{Claims: []Claim{claimRec("uid-a", "p1")}})
	crash(j2)
	if _, d, err = open(t, dir, Options{}); err != nil || len(d.Claims) != 1 || len(d.Allocations) != 1 {
		t.Fatalf("after a claim: %+v, %v", d, err)
	}
}

// TestClaimWithoutUIDRefused: a claim with no UID is not appended, and a
// journal record holding one is damage.
func TestClaimWithoutUIDRefused(t *testing.T) {
	j, _, err := open(t, testutil.TempDir(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.Append(Batch{Claims: []Claim{{Namespace: "ns", Name: "x"}}}); err == nil {
		t.Fatal("a claim without a UID was appended")
	}
	s := newState()
	if err := s.replay([]byte(`{"claims":[{"name":"x"}]}`)); err == nil {
		t.Fatal("a claim record without a UID replayed")
	}
}

func containsField(s, name string) bool {
	return strings.Contains(s, `"`+name+`"`)
}

// TestIntentsReplayed: intents are claim records under their own keys:
// put beside the claims, updated, removed in the commit that records the
// claim, and replayed after a crash as they stood.
func TestIntentsReplayed(t *testing.T) {
	dir := testutil.TempDir(t)
	j, _, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	pod := ClaimPod{UID: "p1", Namespace: "ns", Name: "pod-p1"}
	a := Claim{UID: IntentKey("p1", "ns", "claim-a"), Namespace: "ns", Name: "claim-a", State: ClaimIntent, Pods: []ClaimPod{pod}}
	b := Claim{UID: IntentKey("p1", "ns", "claim-b"), Namespace: "ns", Name: "claim-b", State: ClaimIntent, Pods: []ClaimPod{pod}}
	commit(t, j, Batch{Claims: []Claim{a, b}})
	a.ClaimUID, a.Drivers, a.AllocatedHere = "uid-a", []string{"gpu.example.com"}, true
	commit(t, j, Batch{Claims: []Claim{a}})
	prepared := claimRec("uid-b", "p1")
	commit(t, j, Batch{Claims: []Claim{prepared}, RemovedClaims: []string{b.UID}})
	crash(j)

	_, d, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Claim{a, prepared}
	if a.UID > prepared.UID {
		want = []Claim{prepared, a}
	}
	if !reflect.DeepEqual(d.Claims, want) {
		t.Fatalf("after replay:\n got %+v\nwant %+v", d.Claims, want)
	}
}
