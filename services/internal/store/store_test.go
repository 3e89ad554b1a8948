package store

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
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

// open returns a loaded Journal in dir, flushed when the test ends.
func open(t testing.TB, dir string, opts Options) (*Journal, *Data, error) {
	t.Helper()
	j := New(dir, opts)
	d, err := j.Load()
	t.Cleanup(func() { _ = j.Flush() })
	return j, d, err
}

// crash stops using j as a kill would: no flush, its file closed.
func crash(j *Journal) {
	j.mu.Lock()
	j.closed = true
	j.mu.Unlock()
	j.wg.Wait()
	j.mu.Lock()
	if j.f != nil {
		_ = j.f.Close()
		j.f = nil
	}
	j.mu.Unlock()
}

func commit(t testing.TB, j *Journal, b Batch) {
	t.Helper()
	if err := Commit(j, b); err != nil {
		t.Fatal(err)
	}
}

func mustState(t testing.TB, dir string) *Data {
	t.Helper()
	d, err := ReadState(dir)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// asides lists the files moved aside in dir.
func asides(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, FileName+"*.corrupt-*"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func journalFiles(t testing.TB, dir string) []journalFile {
	t.Helper()
	js, err := listJournals(Path(dir))
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func TestJournalCommitPutsAndRemoves(t *testing.T) {
	dir := testutil.TempDir(t)
	j, d, err := open(t, dir, Options{})
	if d != nil || err != nil {
		t.Fatalf("Load with no files: %v, %v", d, err)
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
		commit(t, j, st.batch)
		if got := mustState(t, dir); !reflect.DeepEqual(got, st.want) {
			t.Fatalf("%s: saved state\n%+v\nwant\n%+v", st.name, got, st.want)
		}
	}
	// The journal holds the changes; the snapshot is still the empty one
	// written at Load.
	if snap, err := ReadFile(j.Location()); err != nil || len(snap.Resources)+len(snap.Allocations) != 0 {
		t.Fatalf("snapshot: %+v, %v", snap, err)
	}
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := Commit(j, Batch{Resources: []Resource{res("x")}}); !errors.Is(err, ErrClosed) {
		t.Fatalf("commit after Flush: %v", err)
	}
	// A new Store over the same files loads them, and starts from a new
	// snapshot with an empty journal.
	j2, d, err := open(t, dir, Options{})
	if err != nil || !reflect.DeepEqual(d, steps[2].want) {
		t.Fatalf("Load = %+v, %v", d, err)
	}
	if snap, err := ReadFile(j2.Location()); err != nil || !reflect.DeepEqual(snap, steps[2].want) {
		t.Fatalf("snapshot after Load: %+v, %v", snap, err)
	}
	if js := journalFiles(t, dir); len(js) != 1 || len(scanJournal(js[0]).records) != 0 {
		t.Fatalf("journals after Load: %+v", js)
	}
	commit(t, j2, Batch{Allocations: []Allocation{alloc("p3", "example.com/a", "d2")}})
	if got := mustState(t, dir); len(got.Resources) != 1 || len(got.Allocations) != 2 {
		t.Fatalf("after a commit on the reloaded store: %+v", got)
	}
	if a := asides(t, dir); len(a) != 0 {
		t.Fatalf("files moved aside: %v", a)
	}
}

// TestJournalCommittedSurvivesCrash: what a Commit acknowledged is read
// back after the process stops without a flush.
func TestJournalCommittedSurvivesCrash(t *testing.T) {
	dir := testutil.TempDir(t)
	j, _, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := &Data{Resources: []Resource{res("example.com/a", "d0", "d1")}, Allocations: []Allocation{}}
	commit(t, j, Batch{Resources: want.Resources})
	for i := range 20 {
		a := alloc(fmt.Sprintf("p%02d", i), "example.com/a", "d0")
		commit(t, j, Batch{Allocations: []Allocation{a}})
		if i%3 == 0 {
			commit(t, j, Batch{RemovedAllocations: []AllocationKey{a.Key()}})
		} else {
			want.Allocations = append(want.Allocations, a)
		}
	}
	crash(j)
	_, d, err := open(t, dir, Options{})
	if err != nil || !reflect.DeepEqual(d, want) {
		t.Fatalf("after a crash: %+v, %v\nwant %+v", d, err, want)
	}
}

// tornJournal commits three allocations, crashes, and returns the
// current journal's path and the state committed.
func tornJournal(t *testing.T, dir string) (string, *Data) {
	t.Helper()
	j, _, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := &Data{Resources: []Resource{}, Allocations: []Allocation{}}
	for i := range 3 {
		a := alloc(fmt.Sprintf("p%d", i), "example.com/a", fmt.Sprintf("d%d", i))
		commit(t, j, Batch{Allocations: []Allocation{a}})
		want.Allocations = append(want.Allocations, a)
	}
	path := journalPath(j.path, j.num)
	crash(j)
	return path, want
}

// records returns the journal at path up to the end of its records,
// without the padding after them: a journal as an older release wrote it.
func records(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, good, torn, err := scanFrames(b)
	if err != nil || torn || good == len(b) {
		t.Fatalf("journal %s: %d of %d bytes of records, torn %v, %v; want records and padding", path, good, len(b), torn, err)
	}
	return b[:good]
}

// TestTornTailDroppedQuietly: a last record cut short (it was never
// acknowledged) is dropped without a word; the records before it are kept.
func TestTornTailDroppedQuietly(t *testing.T) {
	frame := appendFrame(nil, []byte(`{"allocations":[{"pod_uid":"never-acknowledged","container_name":"c","resource_name":"r"}]}`))
	for _, tc := range []struct {
		name string
		tail []byte
	}{
		{"half a header", frame[:5]},
		{"header only", frame[:frameHeader]},
		{"half a record", frame[:len(frame)/2]},
		{"all but one byte", frame[:len(frame)-1]},
		{"zeros", make([]byte, 64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.TempDir(t)
			path, want := tornJournal(t, dir)
			// Appended to the records, as in a journal of an older
			// release or one grown past its padding.
			if err := os.WriteFile(path, append(records(t, path), tc.tail...), 0o600); err != nil {
				t.Fatal(err)
			}
			_, d, err := open(t, dir, Options{})
			if err != nil || !reflect.DeepEqual(d, want) {
				t.Fatalf("Load = %+v, %v\nwant %+v", d, err, want)
			}
			if a := asides(t, dir); len(a) != 0 {
				t.Fatalf("a torn tail was moved aside: %v", a)
			}
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the torn journal is still there: %v", err)
			}
		})
	}
}

// TestJournalPreallocated: a journal is created with padding that
// records are written over, so that its size (metadata) does not change
// as records are appended; they are read back after a crash.
func TestJournalPreallocated(t *testing.T) {
	dir := testutil.TempDir(t)
	path, want := tornJournal(t, dir)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if wantSize := preallocation(DefaultCompactAt, 0); fi.Size() != wantSize {
		t.Fatalf("journal of %d bytes after three records, want its preallocated %d", fi.Size(), wantSize)
	}
	if got := len(records(t, path)); got >= int(fi.Size()) {
		t.Fatalf("%d bytes of records in a journal of %d", got, fi.Size())
	}
	if _, d, err := open(t, dir, Options{}); err != nil || !reflect.DeepEqual(d, want) {
		t.Fatalf("Load = %+v, %v\nwant %+v", d, err, want)
	}
	if a := asides(t, dir); len(a) != 0 {
		t.Fatalf("moved aside: %v", a)
	}
}

// TestTornWriteOverPadding: a crash while records are written over the
// padding can leave any of the write's sectors unwritten (zeros); such a
// record was never acknowledged and is dropped quietly, with whatever
// follows it, as long as no valid record follows it. One that does (a
// later sector of the same write that made it, which cannot be told from
// zeros inside an early record) is loud: the journal is moved aside, and
// what is kept is the same, the records before the damage. Damage there
// (no sector of zeros) is loud.
func TestTornWriteOverPadding(t *testing.T) {
	// A record spanning several sectors, and one after it (written in the
	// same batch).
	big := alloc("never-acknowledged", "example.com/a", "d9")
	big.Response = bytes.Repeat([]byte{'r'}, 3*sectorSize)
	e1, err := encodeBatch(&Batch{Allocations: []Allocation{big}})
	if err != nil {
		t.Fatal(err)
	}
	e2, err := encodeBatch(&Batch{Allocations: []Allocation{alloc("nor-this", "example.com/a", "d8")}})
	if err != nil {
		t.Fatal(err)
	}
	batch := appendFrame(appendFrame(nil, e1.payload), e2.payload)
	second := frameHeader + len(e1.payload)
	for _, tc := range []struct {
		name string
		// tear alters the batch written at offset off of the file.
		tear  func(w []byte, off int)
		quiet bool
	}{
		{"nothing written", func(w []byte, _ int) { clear(w) }, true},
		{"first sector not written", func(w []byte, off int) {
			clear(w[:sectorSize-off%sectorSize])
			clear(w[second:])
		}, true},
		{"a middle sector not written", func(w []byte, off int) {
			s := 2*sectorSize - off%sectorSize
			clear(w[s : s+sectorSize])
			clear(w[second:])
		}, true},
		{"first sector not written, the next record whole", func(w []byte, off int) { clear(w[:sectorSize-off%sectorSize]) }, false},
		{"a middle sector not written, the next record whole", func(w []byte, off int) {
			s := 2*sectorSize - off%sectorSize
			clear(w[s : s+sectorSize])
		}, false},
		{"last sectors not written", func(w []byte, off int) { clear(w[len(w)/2+sectorSize-(off+len(w)/2)%sectorSize:]) }, true},
		{"all written, a byte flipped", func(w []byte, _ int) { w[frameHeader+7] ^= 0x20 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.TempDir(t)
			path, want := tornJournal(t, dir)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			off := len(records(t, path))
			w := append([]byte(nil), batch...)
			tc.tear(w, off)
			copy(b[off:], w)
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			_, d, err := open(t, dir, Options{})
			if !tc.quiet {
				// The record after the damage is kept too: it was
				// acknowledged.
				kept := append(slices.Clone(want.Allocations), alloc("nor-this", "example.com/a", "d8"))
				slices.SortFunc(kept, func(a, b Allocation) int { return a.Key().compare(b.Key()) })
				if ces := Corruptions(err); len(ces) != 1 || ces[0].Path != path || len(ces[0].Gaps) != 1 || d == nil || !reflect.DeepEqual(d.Allocations, kept) {
					t.Fatalf("Load = %+v, %v; want the journal moved aside, its records and the one after the damage kept", d, err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(d, want) {
				t.Fatalf("Load = %+v, %v\nwant %+v", d, err, want)
			}
			if a := asides(t, dir); len(a) != 0 {
				t.Fatalf("a torn write was moved aside: %v", a)
			}
		})
	}
}

// TestDamageBeforeTheTail: a damaged record with records after it, or a
// damaged header, moves the journal aside (one CorruptError) and keeps
// every valid record, before the damage and after it.
func TestDamageBeforeTheTail(t *testing.T) {
	for _, tc := range []struct {
		name string
		// damage alters the journal's bytes; frames are the offsets
		// where its records start (the header first).
		damage func(b []byte, frames []int) []byte
		kept   []int // the allocations kept, by index
		why    string
	}{
		{"payload byte flipped in the second record", func(b []byte, fr []int) []byte { b[fr[2]+frameHeader+3] ^= 0x20; return b }, []int{0, 2}, "checksum mismatch"},
		{"length flipped in the second record", func(b []byte, fr []int) []byte { b[fr[2]] ^= 0x01; return b }, []int{0, 2}, "damaged record header"},
		{"last record complete but damaged", func(b []byte, fr []int) []byte {
			_, end, _, _ := scanFrames(b)
			b[end-2] ^= 0x20
			return b
		}, []int{0, 1}, "checksum mismatch"},
		{"last record complete but damaged, no padding", func(b []byte, fr []int) []byte {
			_, end, _, _ := scanFrames(b)
			b[end-2] ^= 0x20
			return b[:end]
		}, []int{0, 1}, "checksum mismatch"},
		{"header damaged", func(b []byte, fr []int) []byte { b[frameHeader+2] ^= 0x20; return b }, []int{0, 1, 2}, "checksum mismatch"},
		{"empty file", func([]byte, []int) []byte { return nil }, nil, "no header"},
		{"foreign JSON", func([]byte, []int) []byte { return []byte(`{"kind":"SomethingElse"}`) }, nil, "damaged record header"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.TempDir(t)
			path, want := tornJournal(t, dir)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var frames []int
			p, _, _, _ := scanFrames(b)
			for off, i := 0, 0; i < len(p); i++ {
				frames = append(frames, off)
				off += frameHeader + len(p[i])
			}
			if len(frames) != 4 {
				t.Fatalf("%d frames in the journal, want a header and 3 records", len(frames))
			}
			damaged := tc.damage(append([]byte(nil), b...), frames)
			if err := os.WriteFile(path, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			_, d, err := open(t, dir, Options{})
			ces := Corruptions(err)
			if len(ces) != 1 || !OnlyCorruptions(err) || !errors.Is(err, ErrCorrupt) || ces[0].Path != path || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("Load error %v; want one file moved aside for %q", err, tc.why)
			}
			if got, _ := os.ReadFile(ces[0].MovedTo); string(got) != string(damaged) {
				t.Fatal("the moved-aside journal differs from the damaged one")
			}
			var kept, wantKept []Allocation
			if d != nil {
				kept = d.Allocations
			}
			for _, i := range tc.kept {
				wantKept = append(wantKept, want.Allocations[i])
			}
			if len(kept) != len(wantKept) || (len(wantKept) > 0 && !reflect.DeepEqual(kept, wantKept)) {
				t.Fatalf("kept %+v, want %v of %+v", kept, tc.kept, want.Allocations)
			}
			// What was kept is saved afresh: a second start is quiet.
			if _, d2, err := open(t, dir, Options{}); err != nil || len(d2.Allocations) != len(wantKept) {
				t.Fatalf("second Load: %+v, %v", d2, err)
			}
		})
	}
}

// TestDamagedJournalKeepsLaterOnes: a journal torn before its end, with a
// later journal holding records, is damage: it is moved aside, its
// records kept, and the later journal's records are replayed after it.
func TestDamagedJournalKeepsLaterOnes(t *testing.T) {
	dir := testutil.TempDir(t)
	path, _ := tornJournal(t, dir)
	// A later journal with a record, as a compaction that switched to it
	// leaves.
	next, _, err := createJournal(Path(dir), 99, 0)
	if err != nil {
		t.Fatal(err)
	}
	e, err := encodeBatch(&Batch{Allocations: []Allocation{alloc("later", "example.com/a", "d9")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := next.Write(appendFrame(nil, e.payload)); err != nil {
		t.Fatal(err)
	}
	_ = next.Close()
	b := records(t, path)
	if err := os.WriteFile(path, b[:len(b)-3], 0o600); err != nil { // torn, but not the last journal
		t.Fatal(err)
	}
	_, d, err := open(t, dir, Options{})
	ces := Corruptions(err)
	if len(ces) != 1 || ces[0].Path != path || len(ces[0].Also) != 0 || len(ces[0].Gaps) != 1 || !strings.Contains(err.Error(), "before the journal's end") {
		t.Fatalf("Load error %v", err)
	}
	if g := ces[0].Gaps[0]; g.After != 1 || len(g.Named.Allocations) != 1 || g.Named.Allocations[0].PodUID != "p2" {
		t.Fatalf("gap %+v: want one record recovered after it, and p2 named in it", g)
	}
	if d == nil || len(d.Allocations) != 3 || d.Allocations[0].PodUID != "later" {
		t.Fatalf("kept %+v, want the two records before the damage and the later journal's", d)
	}
}

// TestCorruptSnapshotMovesJournalsAside: a damaged snapshot is moved aside
// with its journals, which mean nothing without it.
func TestCorruptSnapshotMovesJournalsAside(t *testing.T) {
	dir := testutil.TempDir(t)
	tornJournal(t, dir)
	snap := Path(dir)
	b, _ := os.ReadFile(snap)
	if err := os.WriteFile(snap, b[:len(b)-10], 0o600); err != nil {
		t.Fatal(err)
	}
	_, d, err := open(t, dir, Options{})
	ces := Corruptions(err)
	if d != nil || len(ces) != 1 || ces[0].Path != snap || len(ces[0].Also) != 1 {
		t.Fatalf("Load = %+v, %v", d, err)
	}
	if got := asides(t, dir); len(got) != 2 {
		t.Fatalf("moved aside: %v", got)
	}
}

// writeVersion1 writes sample() in dir as a checkpoint of the older
// format (version 1: the whole state in one file) and returns it, with the
// file's content.
func writeVersion1(t *testing.T, dir string) (*Data, string) {
	t.Helper()
	d := sample()
	data := fmt.Sprintf(`{"resources":[%s],"allocations":[%s,%s]}`, mustJSON(t, d.Resources[0]), mustJSON(t, d.Allocations[0]), mustJSON(t, d.Allocations[1]))
	v1 := fmt.Sprintf(`{"version":1,"checksum":%q,"data":%s}`, checksum([]byte(data)), data)
	if err := os.WriteFile(Path(dir), []byte(v1), 0o600); err != nil {
		t.Fatal(err)
	}
	return d, v1
}

// TestMigrationStoppedEarlyIsQuiet: a migration that stopped (a crash)
// after creating the new empty journal and before its snapshot replaced
// the older checkpoint leaves nothing wrong: the next start migrates
// quietly and moves nothing aside. A journal with records beside the older
// format is still moved aside loudly.
func TestMigrationStoppedEarlyIsQuiet(t *testing.T) {
	dir := testutil.TempDir(t)
	d, v1 := writeVersion1(t, dir)
	f, _, err := createJournal(Path(dir), 1, preallocation(DefaultCompactAt, int64(len(v1))))
	if err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	j, got, err := open(t, dir, Options{})
	if err != nil || !reflect.DeepEqual(got, d) {
		t.Fatalf("Load of a version 1 checkpoint beside an empty journal = %+v, %v", got, err)
	}
	if a := asides(t, dir); len(a) != 0 {
		t.Fatalf("moved aside: %v", a)
	}
	if js := journalFiles(t, dir); len(js) != 1 || js[0].num == 1 {
		t.Fatalf("journals after the migration: %+v", js)
	}
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}

	// The same with a record in the journal: that is not the migration's.
	dir = testutil.TempDir(t)
	writeVersion1(t, dir)
	f, size, err := createJournal(Path(dir), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	e, err := encodeBatch(&Batch{RemovedAllocations: []AllocationKey{d.Allocations[0].Key()}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(appendFrame(nil, e.payload), size); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if _, got, err := open(t, dir, Options{}); !OnlyCorruptions(err) || len(Corruptions(err)) != 1 || !reflect.DeepEqual(got, d) {
		t.Fatalf("Load of a version 1 checkpoint beside a journal with a record = %+v, %v", got, err)
	}
	if a := asides(t, dir); len(a) != 1 {
		t.Fatalf("moved aside: %v", a)
	}
}

// TestMigrateVersion1: a checkpoint of the older format (the whole state
// in one file, no journal) is read and rewritten as a snapshot.
func TestMigrateVersion1(t *testing.T) {
	dir := testutil.TempDir(t)
	d, _ := writeVersion1(t, dir)
	j, got, err := open(t, dir, Options{})
	if err != nil || !reflect.DeepEqual(got, d) {
		t.Fatalf("Load of a version 1 checkpoint = %+v, %v", got, err)
	}
	b, err := os.ReadFile(Path(dir))
	if err != nil || !strings.HasPrefix(string(b), `{"version":2,`) {
		t.Fatalf("not migrated: %.40s, %v", b, err)
	}
	commit(t, j, Batch{RemovedAllocations: []AllocationKey{d.Allocations[0].Key()}})
	crash(j)
	if _, got, err := open(t, dir, Options{}); err != nil || len(got.Allocations) != 1 || got.Allocations[0].PodUID != "q" {
		t.Fatalf("after migration and a change: %+v, %v", got, err)
	}
	if a := asides(t, dir); len(a) != 0 {
		t.Fatalf("moved aside: %v", a)
	}
}

// TestGroupCommit: changes that arrive while a sync is in flight share the
// next one. The first write is held until 63 more changes have been
// appended; they are then written with one sync.
func TestGroupCommit(t *testing.T) {
	dir := testutil.TempDir(t)
	h := &journalHooks{}
	j, _, err := open(t, dir, Options{hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.failWrite = func() error {
		once.Do(func() { close(entered); <-release })
		return nil
	}
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	wg.Go(func() { errs <- Commit(j, Batch{Allocations: []Allocation{alloc("first", "r", "d")}}) })
	<-entered
	for i := 1; i < n; i++ {
		wg.Go(func() { errs <- Commit(j, Batch{Allocations: []Allocation{alloc(fmt.Sprintf("p%d", i), "r", "d")}}) })
	}
	testutil.Eventually(t, "every change appended", func() error {
		j.mu.Lock()
		defer j.mu.Unlock()
		if j.seq != n {
			return fmt.Errorf("%d appended", j.seq)
		}
		return nil
	})
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if s := h.syncs.Load(); s != 2 {
		t.Fatalf("%d changes took %d syncs, want 2", n, s)
	}
	if d := mustState(t, dir); len(d.Allocations) != n {
		t.Fatalf("%d allocations saved, want %d", len(d.Allocations), n)
	}
}

// TestFailedWriteIsRetried: a change whose write failed is applied but not
// durable; the next Wait writes it (cutting off whatever the failed write
// left).
func TestFailedWriteIsRetried(t *testing.T) {
	dir := testutil.TempDir(t)
	h := &journalHooks{}
	j, _, err := open(t, dir, Options{hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	fail := true
	h.failWrite = func() error {
		if fail {
			// A partial frame, as a failed write may leave, over the
			// padding.
			_, _ = j.f.WriteAt([]byte{1, 2, 3}, j.size)
			return errors.New("disk full")
		}
		return nil
	}
	if err := Commit(j, Batch{Allocations: []Allocation{alloc("p1", "r", "d1")}}); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("commit with a failing disk: %v", err)
	}
	fail = false
	commit(t, j, Batch{})
	commit(t, j, Batch{Allocations: []Allocation{alloc("p2", "r", "d2")}})
	crash(j)
	if _, d, err := open(t, dir, Options{}); err != nil || len(d.Allocations) != 2 {
		t.Fatalf("after a failed write and a retry: %+v, %v", d, err)
	}
}

// TestJournalRemovedWhileOpen: a journal file removed under the running
// store fails the next commit rather than acknowledging writes no restart
// would read; the one after starts anew with a full snapshot.
func TestJournalRemovedWhileOpen(t *testing.T) {
	dir := testutil.TempDir(t)
	j, _, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	commit(t, j, Batch{Resources: []Resource{res("example.com/a", "d0")}})
	if err := os.Remove(journalPath(j.path, j.num)); err != nil {
		t.Fatal(err)
	}
	if err := Commit(j, Batch{Allocations: []Allocation{alloc("p1", "example.com/a", "d0")}}); err == nil {
		t.Fatal("a commit into a removed journal succeeded")
	}
	commit(t, j, Batch{})
	if d := mustState(t, dir); len(d.Resources) != 1 || len(d.Allocations) != 1 {
		t.Fatalf("saved after the journal was removed: %+v", d)
	}
}

// TestCompactionBoundsJournal: under a long Allocate/Release loop the
// snapshot is rewritten in the background and the journal stays small.
func TestCompactionBoundsJournal(t *testing.T) {
	dir := testutil.TempDir(t)
	const compactAt = 8 << 10
	h := &journalHooks{}
	j, _, err := open(t, dir, Options{CompactAt: compactAt, hooks: h})
	if err != nil {
		t.Fatal(err)
	}
	commit(t, j, Batch{Resources: []Resource{res("example.com/a", "d0", "d1", "d2", "d3")}})
	var appended int64
	const loops = 1500
	for i := range loops {
		a := alloc(fmt.Sprintf("pod-%d", i), "example.com/a", fmt.Sprintf("d%d", i%4))
		e, _ := encodeBatch(&Batch{Allocations: []Allocation{a}})
		appended += int64(2 * (frameHeader + len(e.payload)))
		commit(t, j, Batch{Allocations: []Allocation{a}})
		commit(t, j, Batch{RemovedAllocations: []AllocationKey{a.Key()}})
		if js := journalFiles(t, dir); len(js) > 3 {
			t.Fatalf("loop %d: %d journals", i, len(js))
		}
	}
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, jf := range journalFiles(t, dir) {
		fi, err := os.Stat(jf.path)
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
	}
	if c := h.compactions.Load(); c == 0 || total > appended/4 {
		t.Fatalf("%d compactions; journals hold %d bytes of %d appended", c, total, appended)
	}
	if _, d, err := open(t, dir, Options{}); err != nil || len(d.Allocations) != 0 || len(d.Resources) != 1 {
		t.Fatalf("after the loop: %+v, %v", d, err)
	}
}

// TestCompactionFailureIsLogged: a compaction that fails (here a
// directory holds the snapshot's place, so no snapshot can be renamed
// there) loses nothing and says so once while it keeps failing; it is
// retried after later writes, and its first success is logged too.
func TestCompactionFailureIsLogged(t *testing.T) {
	dir := testutil.TempDir(t)
	var logMu sync.Mutex
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	count := func(s string) int {
		logMu.Lock()
		defer logMu.Unlock()
		return strings.Count(logs.String(), s)
	}
	j, _, err := open(t, dir, Options{CompactAt: 4 << 10, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	commit(t, j, Batch{Resources: []Resource{res("example.com/a", "d0")}})
	if err := os.Remove(Path(dir)); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(Path(dir), "taken"), 0o700); err != nil {
		t.Fatal(err)
	}
	i := 0
	loopUntil := func(what string, done func() bool) {
		t.Helper()
		for start := i; !done(); i++ {
			if i-start > 20000 {
				t.Fatalf("%s: not after %d Allocate/Release records", what, 2*(i-start))
			}
			a := alloc(fmt.Sprintf("pod-%d", i), "example.com/a", "d0")
			commit(t, j, Batch{Allocations: []Allocation{a}})
			commit(t, j, Batch{RemovedAllocations: []AllocationKey{a.Key()}})
		}
	}
	failures := func() int {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.compactFailures
	}
	loopUntil("three failed compactions", func() bool { return failures() >= 3 })
	if n := count("checkpoint compaction failed"); n != 1 {
		t.Fatalf("%d failures, logged %d times, want once:\n%s", failures(), n, logs.String())
	}
	if err := os.RemoveAll(Path(dir)); err != nil {
		t.Fatal(err)
	}
	loopUntil("a compaction that works", func() bool { return count("checkpoint compaction works again") == 1 })
	if err := j.Flush(); err != nil {
		t.Fatal(err)
	}
	if js := journalFiles(t, dir); len(js) != 1 {
		t.Fatalf("journals after the compaction that worked: %+v", js)
	}
	if _, d, err := open(t, dir, Options{}); err != nil || len(d.Allocations) != 0 || !reflect.DeepEqual(d.Resources, []Resource{res("example.com/a", "d0")}) {
		t.Fatalf("after the failures: %+v, %v", d, err)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestCompactionCrashPoints: a crash at each step of a compaction leaves
// files that restore every acknowledged change.
func TestCompactionCrashPoints(t *testing.T) {
	for _, step := range []string{"start", "created", "switched", "snapshot"} {
		t.Run(step, func(t *testing.T) {
			dir := testutil.TempDir(t)
			h := &journalHooks{}
			j, _, err := open(t, dir, Options{CompactAt: 2 << 10, hooks: h})
			if err != nil {
				t.Fatal(err)
			}
			stopped := make(chan struct{})
			var once sync.Once
			h.crash = func(s string) error {
				if s != step {
					return nil
				}
				fired := false
				once.Do(func() { fired = true; close(stopped) })
				if fired {
					return errors.New("crash")
				}
				return nil
			}
			want := map[string]bool{}
			i := 0
			add := func() {
				pod := fmt.Sprintf("pod-%d", i)
				commit(t, j, Batch{Allocations: []Allocation{alloc(pod, "example.com/a", "d0")}})
				want[pod] = true
				if i%2 == 0 {
					commit(t, j, Batch{RemovedAllocations: []AllocationKey{{pod, "c", "example.com/a"}}})
					delete(want, pod)
				}
				i++
			}
			for {
				add()
				select {
				case <-stopped:
				default:
					continue
				}
				break
			}
			// Changes after the stopped compaction, then the crash.
			for range 5 {
				add()
			}
			crash(j)
			_, d, err := open(t, dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, a := range d.Allocations {
				got[a.PodUID] = true
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("restored %d allocations, want %d", len(got), len(want))
			}
			if a := asides(t, dir); len(a) != 0 {
				t.Fatalf("moved aside: %v", a)
			}
			if js := journalFiles(t, dir); len(js) != 1 {
				t.Fatalf("journals after Load: %v", js)
			}
		})
	}
}

// TestLoadRemovesTemporaryFiles: temporary files a crash left are removed.
func TestLoadRemovesTemporaryFiles(t *testing.T) {
	dir := testutil.TempDir(t)
	for _, name := range []string{"." + FileName + ".tmp-0011", "." + FileName + ".journal-tmp-0022"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := open(t, dir, Options{}); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Fatalf("temporary file left: %s", e.Name())
		}
	}
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDamagedRecordWithZerosInItsHeaderIsLoud: a record whose payload is
// damaged, its header intact, is damage even when the header's first bytes
// (here a length of 512, whose low byte is 0) fall alone in the end of a
// sector: zeros in an intact header are not a sector left unwritten.
func TestDamagedRecordWithZerosInItsHeaderIsLoud(t *testing.T) {
	b := appendFrame(nil, bytes.Repeat([]byte{'x'}, sectorSize-1-frameHeader)) // ends at 511
	second := len(b)
	b = appendFrame(b, bytes.Repeat([]byte{'y'}, 2*256)) // its length's low byte is the sector's last
	b = appendFrame(b, []byte("after"))
	if b[second] != 0 || second%sectorSize != sectorSize-1 {
		t.Fatalf("layout: the second frame at %d starts with %#x", second, b[second])
	}
	if _, good, torn, err := scanFrames(b); err != nil || torn || good != len(b) {
		t.Fatalf("intact frames: good %d of %d, torn %v, %v", good, len(b), torn, err)
	}
	b[second+frameHeader+100] ^= 0x20
	_, good, torn, err := scanFrames(b)
	if !errors.Is(err, ErrCorrupt) || torn || good != second {
		t.Fatalf("damaged second frame: good %d, torn %v, %v; want damage at %d", good, torn, err, second)
	}
}
