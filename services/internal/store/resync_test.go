package store

import (
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// tenRecords commits ten changes, each on its own, as the issue found
// them: a registration, five allocations, the release of the first, a
// sixth allocation, the resource again and a seventh allocation. It
// crashes and returns the journal's path and the batches in order.
func tenRecords(t *testing.T, dir string) (string, []Batch) {
	t.Helper()
	j, _, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const r = "example.com/ten"
	bs := []Batch{{Resources: []Resource{res(r, "d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8")}}}
	for i := 1; i <= 5; i++ {
		bs = append(bs, Batch{Allocations: []Allocation{alloc(fmt.Sprintf("pod-%d", i), r, fmt.Sprintf("d%d", i))}})
	}
	bs = append(bs, Batch{RemovedAllocations: []AllocationKey{bs[1].Allocations[0].Key()}},
		Batch{Allocations: []Allocation{alloc("pod-6", r, "d6")}},
		Batch{Resources: []Resource{res(r, "d1", "d2", "d3", "d4", "d5", "d6", "d7")}},
		Batch{Allocations: []Allocation{alloc("pod-7", r, "d7")}})
	for _, b := range bs {
		commit(t, j, b)
	}
	path := journalPath(j.path, j.num)
	crash(j)
	return path, bs
}

// model replays batches on maps, the state they describe.
func model(bs []Batch) *Data {
	rs, as := map[string]Resource{}, map[AllocationKey]Allocation{}
	for _, b := range bs {
		for _, k := range b.RemovedAllocations {
			delete(as, k)
		}
		for _, a := range b.Allocations {
			as[a.Key()] = a
		}
		for _, r := range b.Resources {
			rs[r.Name] = r
		}
	}
	d := &Data{Resources: []Resource{}, Allocations: []Allocation{}, Claims: []Claim{}}
	for _, n := range slices.Sorted(maps.Keys(rs)) {
		d.Resources = append(d.Resources, rs[n])
	}
	for _, k := range slices.SortedFunc(maps.Keys(as), AllocationKey.compare) {
		d.Allocations = append(d.Allocations, as[k])
	}
	return d
}

// frameOffsets returns where each frame of the journal b starts, and its
// end: the header, then the records.
func frameOffsets(t *testing.T, b []byte) []int {
	t.Helper()
	p, good, torn, err := splitFrames(b)
	if err != nil || torn {
		t.Fatalf("journal: torn %v, %v", torn, err)
	}
	var off []int
	for o, i := 0, 0; i < len(p); i++ {
		off = append(off, o)
		o += frameHeader + len(p[i])
	}
	return append(off, good)
}

// TestZeroedSectorKeepsEveryOtherRecord: whichever sector of a journal of
// ten records is zeroed, every record that does not touch it is recovered,
// those after it too, and the one gap spans exactly the records it
// touches. A sector that touches only the last records, with nothing
// valid after it, is a torn tail: those records are dropped quietly.
func TestZeroedSectorKeepsEveryOtherRecord(t *testing.T) {
	dir := testutil.TempDir(t)
	path, bs := tenRecords(t, dir)
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fr := frameOffsets(t, orig)
	for s := 0; s*sectorSize < fr[len(fr)-1]; s++ {
		t.Run(fmt.Sprintf("sector %d", s), func(t *testing.T) {
			from, to := s*sectorSize, (s+1)*sectorSize
			var kept []Batch
			first, last := -1, -1 // the frames touched
			for i := range len(fr) - 1 {
				if fr[i] < to && fr[i+1] > from {
					first, last = cond(first < 0, i, first), i
				} else if i > 0 {
					kept = append(kept, bs[i-1])
				}
			}
			dir := testutil.TempDir(t)
			b := slices.Clone(orig)
			clear(b[from:to])
			if err := os.WriteFile(journalPath(Path(dir), 1), b, 0o600); err != nil {
				t.Fatal(err)
			}
			_, d, err := open(t, dir, Options{})
			if mustJSON(t, d) != mustJSON(t, model(kept)) {
				t.Fatalf("recovered %+v\nwant %+v", d, model(kept))
			}
			if last == len(fr)-2 { // the tail: a torn write
				if err != nil {
					t.Fatalf("a torn tail: %v", err)
				}
				return
			}
			ces := Corruptions(err)
			if len(ces) != 1 || len(ces[0].Gaps) != 1 {
				t.Fatalf("Load error %v; want one journal moved aside with one gap", err)
			}
			g := ces[0].Gaps[0]
			if g.From != int64(fr[first]) || g.To != int64(fr[last+1]) || g.After != len(bs)-last {
				t.Fatalf("gap %s; want bytes %d to %d, %d records after it", g, fr[first], fr[last+1], len(bs)-last)
			}
		})
	}
}

func cond[T any](c bool, a, b T) T {
	if c {
		return a
	}
	return b
}

// TestGapInRecordTwoOfTen: the case as found. A sector zeroed inside the
// second record of ten (the first allocation) loses that record only:
// every other acknowledged allocation is kept, the gap is named to the
// byte, and the release of pod-1 after it, whose allocation the gap held,
// is named as finding nothing to release.
func TestGapInRecordTwoOfTen(t *testing.T) {
	dir := testutil.TempDir(t)
	path, bs := tenRecords(t, dir)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fr := frameOffsets(t, b)
	clear(b[fr[2]+frameHeader+20 : fr[3]-10]) // inside record 2, its header and last bytes intact
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, d, err := open(t, dir, Options{})
	want := model(slices.Delete(slices.Clone(bs), 1, 2))
	if mustJSON(t, d) != mustJSON(t, want) || len(d.Allocations) != 6 {
		t.Fatalf("recovered %+v\nwant %+v", d, want)
	}
	ces := Corruptions(err)
	if len(ces) != 1 || len(ces[0].Gaps) != 1 {
		t.Fatalf("Load error %v", err)
	}
	g := ces[0].Gaps[0]
	if g.From != int64(fr[2]) || g.To != int64(fr[3]) || g.Records != 1 || g.After != 8 || g.Journal != path {
		t.Fatalf("gap %s; want record 2 exactly (bytes %d to %d), 8 records after it", g, fr[2], fr[3])
	}
	if u := g.Unmatched.Allocations; len(u) != 1 || u[0].PodUID != "pod-1" || !slices.Equal(g.Pods(), []string{"pod-1"}) {
		t.Fatalf("unmatched %+v, pods %v; want the release of pod-1", g.Unmatched, g.Pods())
	}
	for _, s := range []string{fmt.Sprintf("bytes %d to %d", fr[2], fr[3]), "1 record,", "8 records recovered after it", "pod pod-1"} {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not say %q", err, s)
		}
	}
}

// TestRecordThatDoesNotApply: a record whose checksums hold but that is
// not a change (a bug, or a file written by hand) is a gap of exactly that
// record; the records around it are kept.
func TestRecordThatDoesNotApply(t *testing.T) {
	dir := testutil.TempDir(t)
	path, want := tornJournal(t, dir)
	b := records(t, path)
	fr := frameOffsets(t, b)
	bad := appendFrame(nil, []byte(`{"allocations":[{"pod_uid":"bad","container_name":"c","resource_name":"r","device_ids":["x"],"response":null,"allocated":"2020-01-01T00:00:00Z"}],"unknown_field":1}`))
	b = append(append(append([]byte(nil), b[:fr[2]]...), bad...), b[fr[2]:]...)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, d, err := open(t, dir, Options{})
	if d == nil || !reflect.DeepEqual(d.Allocations, want.Allocations) {
		t.Fatalf("recovered %+v, want %+v", d, want.Allocations)
	}
	ces := Corruptions(err)
	if len(ces) != 1 || len(ces[0].Gaps) != 1 {
		t.Fatalf("Load error %v", err)
	}
	if g := ces[0].Gaps[0]; g.From != int64(fr[2]) || g.To != int64(fr[2]+len(bad)) || g.Records != 1 || g.After != 2 ||
		!strings.Contains(g.Why.Error(), "does not apply") {
		t.Fatalf("gap %s", g)
	}
}

// TestNameIn: what the surviving bytes of a gap name: allocations and
// releases as far as they survive, resources put or removed, claims put
// or removed; a name cut by zeros is not listed.
func TestNameIn(t *testing.T) {
	e, err := encodeBatch(&Batch{
		Allocations:        []Allocation{alloc("pod-a", "example.com/n", "d1", "d2")},
		RemovedAllocations: []AllocationKey{{PodUID: "pod-b", ContainerName: "c", ResourceName: "example.com/n"}},
		Resources:          []Resource{res("example.com/n", "d1")},
		RemovedResources:   []string{"example.com/gone"},
		Claims:             []Claim{{UID: "claim-1", Namespace: "ns", Name: "c1", State: ClaimPrepared}},
		RemovedClaims:      []string{"claim-2"},
	})
	if err != nil {
		t.Fatal(err)
	}
	n := nameIn(e.payload)
	if len(n.Allocations) != 2 || n.Allocations[0].PodUID != "pod-a" || !slices.Equal(n.Allocations[0].DeviceIDs, []string{"d1", "d2"}) ||
		n.Allocations[1].AllocationKey != (AllocationKey{"pod-b", "c", "example.com/n"}) {
		t.Fatalf("allocations named: %+v", n.Allocations)
	}
	if !slices.Equal(n.Resources, []string{"example.com/n", "example.com/gone"}) || !slices.Equal(n.Claims, []string{"claim-1", "claim-2"}) {
		t.Fatalf("resources %v, claims %v", n.Resources, n.Claims)
	}
	cut := slices.Clone(e.payload)
	at := strings.Index(string(cut), "pod-a") + 3
	clear(cut[at : at+40])
	if n := nameIn(cut); len(n.Allocations) != 1 || n.Allocations[0].PodUID != "pod-b" {
		t.Fatalf("a name cut by zeros: %+v", n.Allocations)
	}
}

// TestDamagedJournalBesideOlderFormatIsLoud: a journal beside a checkpoint
// of the older format that holds no valid record but damage is not the
// migration's empty journal: it is moved aside loudly, not removed.
func TestDamagedJournalBesideOlderFormatIsLoud(t *testing.T) {
	dir := testutil.TempDir(t)
	d, _ := writeVersion1(t, dir)
	f, size, err := createJournal(Path(dir), 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	rec := appendFrame(nil, []byte(`{"removed_resources":["x"]}`))
	rec[frameHeader+3] ^= 0x20 // whole, but its checksum fails: damage
	if _, err := f.WriteAt(rec, size); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	if _, got, err := open(t, dir, Options{}); len(Corruptions(err)) != 1 || !reflect.DeepEqual(got, d) {
		t.Fatalf("Load = %+v, %v; want the older checkpoint's state and the journal moved aside", got, err)
	}
	if a := asides(t, dir); len(a) != 1 {
		t.Fatalf("moved aside: %v", a)
	}
}

// FuzzResync: whatever a journal holds, resync finds frames that are
// valid, in order, and spans between them that do not overlap them or
// each other, and nothing valid is left between them unfound.
func FuzzResync(f *testing.F) {
	rec := appendFrame(nil, []byte(`{"removed_resources":["x"]}`))
	two := append(slices.Clone(rec), rec...)
	f.Add(two)
	f.Add(append(append(slices.Clone(rec[:5]), make([]byte, 40)...), rec...))
	f.Add(append(append(slices.Clone(rec), 1, 2, 3), rec...))
	f.Fuzz(func(t *testing.T, b []byte) {
		frames, spans, _ := resync(b)
		at := 0
		for _, fr := range frames {
			// frameAt passes over empty frames, which no writer makes.
			if fr.off < at || len(fr.payload) > 0 && !frameAt(b, fr.off) {
				t.Fatalf("frame at %d: not valid, or before %d", fr.off, at)
			}
			at = fr.end()
		}
		end := 0
		for _, s := range spans {
			if s.from < end || s.to < s.from || s.to > len(b) || s.err == nil {
				t.Fatalf("span %+v after %d", s, end)
			}
			if at := nextFrame(b, s.from+1); at >= 0 && at < s.to {
				t.Fatalf("a valid frame at %d inside the span %d to %d", at, s.from, s.to)
			}
			end = s.to
		}
	})
}
