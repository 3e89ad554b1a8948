package manager

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// journalOfTen saves, in dir, ten changes as separate records (a
// registration, five allocations, the release of the first, three more
// allocations), and returns the journal's path and where the second
// record's payload starts and ends.
func journalOfTen(t *testing.T, dir string) (path string, from, to int) {
	t.Helper()
	s := store.New(dir, store.Options{})
	if _, err := s.Load(); err != nil {
		t.Fatal(err)
	}
	const r = "example.com/gap"
	batches := []store.Batch{{Resources: []store.Resource{{Name: r, Devices: []store.Device{{ID: "d1"}, {ID: "d2"}}, Endpoints: []store.Endpoint{}}}}}
	for i := 1; i <= 5; i++ {
		batches = append(batches, store.Batch{Allocations: []store.Allocation{{PodUID: fmt.Sprintf("pod-%d", i), ContainerName: "c", ResourceName: r,
			DeviceIDs: []string{fmt.Sprintf("d%d", i)}, Response: []byte{}}}})
	}
	batches = append(batches, store.Batch{RemovedAllocations: []store.AllocationKey{batches[1].Allocations[0].Key()}})
	for i := 6; i <= 8; i++ {
		batches = append(batches, store.Batch{Allocations: []store.Allocation{{PodUID: fmt.Sprintf("pod-%d", i), ContainerName: "c", ResourceName: r,
			DeviceIDs: []string{fmt.Sprintf("d%d", i)}, Response: []byte{}}}})
	}
	for _, b := range batches {
		if err := store.Commit(s, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	journals, _ := filepath.Glob(store.Path(dir) + ".journal.*")
	if len(journals) != 1 {
		t.Fatalf("journals: %v", journals)
	}
	b, err := os.ReadFile(journals[0])
	if err != nil {
		t.Fatal(err)
	}
	// The second record (pod-1's allocation) is the first to name pod-1.
	at := bytes.Index(b, []byte(`"pod-1"`))
	return journals[0], at - 20, at + 60
}

// TestDamagedJournalIsNamedAtStart: a devicemanager whose journal has a
// zeroed span inside its second record of ten starts with every other
// acknowledged allocation, and says so in one loud line that names the
// span (file and bytes), the pod whose release after it found nothing
// (its allocation was in the span), and what "recovered" means.
func TestDamagedJournalIsNamedAtStart(t *testing.T) {
	dir := testutil.TempDir(t)
	path, from, to := journalOfTen(t, dir)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	clear(b[from:to])
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	m, logs := openLogged(t, dir)
	var pods []string
	for _, a := range m.ListAllocations("") {
		pods = append(pods, a.PodUID)
	}
	if strings.Join(pods, ",") != "pod-2,pod-3,pod-4,pod-5,pod-6,pod-7,pod-8" {
		t.Fatalf("allocations after the damage: %v", pods)
	}
	out := logs.String()
	if n := strings.Count(out, "CHECKPOINT UNUSABLE"); n != 1 {
		t.Fatalf("%d loud lines, want one:\n%s", n, out)
	}
	for _, s := range []string{"journal damaged inside", path, "unreadable", "8 records recovered after it", "pods_named=[pod-1]",
		"released_after_damage=\"[pod pod-1 container c resource example.com/gap]\"", "an allocation made there is missing"} {
		if !strings.Contains(out, s) {
			t.Errorf("the loud line does not say %q:\n%s", s, out)
		}
	}
}
