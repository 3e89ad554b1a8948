package store

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

func res(name string, ids ...string) Resource {
	r := Resource{Name: name, Devices: []Device{}, Endpoints: []Endpoint{}}
	for _, id := range ids {
		r.Devices = append(r.Devices, Device{ID: id, Healthy: true})
	}
	return r
}

func alloc(pod, resource string, ids ...string) Allocation {
	return Allocation{PodUID: pod, ContainerName: "c", ResourceName: resource, DeviceIDs: ids, Response: []byte{10, 1, 'x'}, Allocated: time.Unix(7, 0).UTC()}
}

func TestCheckpointCommitPutsAndRemoves(t *testing.T) {
	dir := testutil.TempDir(t)
	s := NewCheckpoint(dir)
	if d, err := s.Load(); d != nil || err != nil {
		t.Fatalf("Load with no file: %v, %v", d, err)
	}
	steps := []struct {
		name  string
		batch Batch
		want  *Data
	}{
		{"put", Batch{Resources: []Resource{res("example.com/b", "d1"), res("example.com/a", "d0")}, Allocations: []Allocation{alloc("p2", "example.com/a", "d0"), alloc("p1", "example.com/b", "d1")}},
			&Data{Resources: []Resource{res("example.com/a", "d0"), res("example.com/b", "d1")}, Allocations: []Allocation{alloc("p1", "example.com/b", "d1"), alloc("p2", "example.com/a", "d0")}}},
		{"replace one", Batch{Resources: []Resource{res("example.com/a", "d0", "d2")}},
			&Data{Resources: []Resource{res("example.com/a", "d0", "d2"), res("example.com/b", "d1")}, Allocations: []Allocation{alloc("p1", "example.com/b", "d1"), alloc("p2", "example.com/a", "d0")}}},
		{"remove", Batch{RemovedResources: []string{"example.com/b"}, RemovedAllocations: []AllocationKey{{"p1", "c", "example.com/b"}}},
			&Data{Resources: []Resource{res("example.com/a", "d0", "d2")}, Allocations: []Allocation{alloc("p2", "example.com/a", "d0")}}},
	}
	for _, st := range steps {
		if err := s.Commit(st.batch); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		got, err := ReadFile(s.Location())
		if err != nil || !reflect.DeepEqual(got, st.want) {
			t.Fatalf("%s: file holds\n%+v, %v\nwant\n%+v", st.name, got, err, st.want)
		}
	}
	// A new Store over the same file loads it, and keeps what it did not
	// change on its next write.
	s2 := NewCheckpoint(dir)
	if d, err := s2.Load(); err != nil || !reflect.DeepEqual(d, steps[2].want) {
		t.Fatalf("Load = %+v, %v", d, err)
	}
	if err := s2.Commit(Batch{Allocations: []Allocation{alloc("p3", "example.com/a", "d2")}}); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(s.Location())
	if err != nil || len(got.Resources) != 1 || len(got.Allocations) != 2 {
		t.Fatalf("after a commit on the reloaded store: %+v, %v", got, err)
	}
}

func TestCheckpointEmptyCommitWritesNothing(t *testing.T) {
	dir := testutil.TempDir(t)
	s := NewCheckpoint(dir)
	if err := s.Commit(Batch{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(s.Location()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("an empty commit wrote the file: %v", err)
	}
	// Flush writes a complete file once, even with nothing committed.
	if err := s.Flush(); err != nil {
		t.Fatal(err)
	}
	if d, err := ReadFile(s.Location()); err != nil || d == nil || len(d.Resources)+len(d.Allocations) != 0 {
		t.Fatalf("after Flush: %+v, %v", d, err)
	}
}

// TestCheckpointFailedCommitStaysPending: a change whose write failed is
// written by the next commit, even an empty one.
func TestCheckpointFailedCommitStaysPending(t *testing.T) {
	dir := filepath.Join(testutil.TempDir(t), "device-plugins")
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	s := NewCheckpoint(dir)
	if err := os.Remove(dir); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(Batch{Resources: []Resource{res("example.com/a", "d0")}}); err == nil {
		t.Fatal("commit into a missing directory succeeded")
	}
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(Batch{}); err != nil {
		t.Fatal(err)
	}
	if d, err := ReadFile(s.Location()); err != nil || d == nil || len(d.Resources) != 1 {
		t.Fatalf("the failed change was not written by the next commit: %+v, %v", d, err)
	}
}

func TestCheckpointLoadMovesCorruptAside(t *testing.T) {
	dir := testutil.TempDir(t)
	s := NewCheckpoint(dir)
	if err := os.WriteFile(s.Location(), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	d, err := s.Load()
	var ce *CorruptError
	if d != nil || !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) || ce.Path != s.Location() {
		t.Fatalf("Load of a corrupt file: %v, %v", d, err)
	}
	if b, rerr := os.ReadFile(ce.MovedTo); rerr != nil || string(b) != "junk" {
		t.Fatalf("moved-aside file %s: %q, %v", ce.MovedTo, b, rerr)
	}
	if _, err := os.Stat(s.Location()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("corrupt file still in place: %v", err)
	}
}
