package store

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// zeroedJournal commits six allocations and then the release of the first,
// each on its own, crashes, and returns the journal's path, its bytes, the
// offsets where its frames start (the header first, then the seven
// records) and the allocations as of each record (after[i]: after record
// i+1).
func zeroedJournal(t *testing.T, dir string) (string, []byte, []int, [][]Allocation) {
	t.Helper()
	j, _, err := open(t, dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var after [][]Allocation
	var live []Allocation
	for i := range 6 {
		a := alloc(fmt.Sprintf("pod-%d", i), "example.com/z", fmt.Sprintf("dev-%d", i))
		commit(t, j, Batch{Allocations: []Allocation{a}})
		live = append(live, a)
		after = append(after, append([]Allocation(nil), live...))
	}
	commit(t, j, Batch{RemovedAllocations: []AllocationKey{live[0].Key()}})
	after = append(after, append([]Allocation(nil), live[1:]...))
	path := journalPath(j.path, j.num)
	crash(j)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	p, _, torn, err := splitFrames(b)
	if err != nil || torn || len(p) != 8 {
		t.Fatalf("journal of %d frames, torn %v, %v; want a header and 7 records", len(p), torn, err)
	}
	var frames []int
	for off, i := 0, 0; i < len(p); i++ {
		frames = append(frames, off)
		off += frameHeader + len(p[i])
	}
	return path, b, append(frames, frames[7]+frameHeader+len(p[7])), after
}

// TestZeroedRecordBeforeTheTailIsLoud: zeros inside a record with intact
// records after it are damage, not a torn write: the journal is moved
// aside with one CorruptError whose one Gap names the damaged record's
// bytes exactly, and every record but the damaged one is kept, those after
// it too. A release after the gap of an allocation the gap held is named
// as such. Zeros in the last record, with nothing valid after it but the
// padding, are still a torn write, dropped quietly.
func TestZeroedRecordBeforeTheTailIsLoud(t *testing.T) {
	for _, tc := range []struct {
		name string
		// zero returns the range of the journal to zero, given the frames'
		// offsets (fr[i]: record i, fr[0] the header, fr[8] the end).
		zero func(fr []int) (int, int)
		lost int // the record lost, 1 to 7 (7: the torn tail, quiet)
		// named is the pod the gap's surviving bytes still name.
		named string
	}{
		// As found: the tail of the first record zeroed, its header
		// intact, the six records after it whole; the last of them
		// releases the allocation the first made.
		{"the first record's payload", func(fr []int) (int, int) { return fr[1] + frameHeader, fr[2] }, 1, ""},
		{"the second record, header and all", func(fr []int) (int, int) { return fr[2], fr[3] }, 2, ""},
		{"the second half of the third record", func(fr []int) (int, int) { return (fr[3] + fr[4]) / 2, fr[4] }, 3, "pod-2"},
		{"the sixth record's payload", func(fr []int) (int, int) { return fr[6] + frameHeader, fr[7] }, 6, ""},
		{"the last record's payload: a torn tail", func(fr []int) (int, int) { return fr[7] + frameHeader, fr[8] }, 7, ""},
		{"the last record, header and all: a torn tail", func(fr []int) (int, int) { return fr[7], fr[8] }, 7, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := testutil.TempDir(t)
			path, b, fr, after := zeroedJournal(t, dir)
			from, to := tc.zero(fr)
			clear(b[from:to])
			if err := os.WriteFile(path, b, 0o600); err != nil {
				t.Fatal(err)
			}
			_, d, err := open(t, dir, Options{})
			want := after[5] // the six allocations; the release of pod-0 is record 7
			switch tc.lost {
			case 7:
			case 1:
				want = after[6] // pod-0 lost, and released all the same
			default:
				want = slices.Delete(slices.Clone(after[6]), tc.lost-2, tc.lost-1)
			}
			checkKept(t, d, want)
			ces := Corruptions(err)
			if tc.lost == 7 {
				if err != nil || len(asides(t, dir)) != 0 {
					t.Fatalf("a torn tail: Load error %v, moved aside %v; want neither", err, asides(t, dir))
				}
				return
			}
			if len(ces) != 1 || !OnlyCorruptions(err) || !errors.Is(err, ErrCorrupt) || ces[0].Path != path || len(ces[0].Gaps) != 1 ||
				!strings.Contains(err.Error(), fmt.Sprintf("at offset %d with a valid record after it", fr[tc.lost])) {
				t.Fatalf("Load error %v; want the journal moved aside, damage at offset %d", err, fr[tc.lost])
			}
			checkZeroedGap(t, ces[0].Gaps[0], fr, tc.lost, tc.named)
			if aside, rerr := os.ReadFile(ces[0].MovedTo); rerr != nil || string(aside) != string(b) {
				t.Fatalf("the moved-aside journal (%v) differs from the damaged one", rerr)
			}
			// What was kept is saved afresh: a second start is quiet and
			// keeps the same.
			if _, d2, err := open(t, dir, Options{}); err != nil || len(d2.Allocations) != len(d.Allocations) {
				t.Fatalf("second Load: %+v, %v", d2, err)
			}
		})
	}
}

// checkKept fails t unless d holds exactly the allocations want.
func checkKept(t *testing.T, d *Data, want []Allocation) {
	t.Helper()
	var got []Allocation
	if d != nil {
		got = d.Allocations
	}
	if len(got) != len(want) || (len(want) > 0 && !reflect.DeepEqual(got, want)) {
		t.Fatalf("kept %d allocations %+v; want %d: %+v", len(got), got, len(want), want)
	}
}

// checkZeroedGap fails t unless g is exactly record lost of the journal
// whose frames start at fr, with the records after it recovered, named as
// it survives, and the release of pod-0 unmatched when its allocation is
// the record lost.
func checkZeroedGap(t *testing.T, g *Gap, fr []int, lost int, named string) {
	t.Helper()
	if g.From != int64(fr[lost]) || g.To != int64(fr[lost+1]) || g.After != 7-lost || g.Whole {
		t.Fatalf("gap %d to %d, %d records after it, whole %v; want %d to %d, %d after", g.From, g.To, g.After, g.Whole, fr[lost], fr[lost+1], 7-lost)
	}
	var pods []string
	for _, a := range g.Named.Allocations {
		pods = append(pods, a.PodUID)
	}
	if (named == "" && len(pods) != 0) || (named != "" && !slices.Equal(pods, []string{named})) {
		t.Fatalf("gap names pods %v; want %q", pods, named)
	}
	unmatched := len(g.Unmatched.Allocations) == 1 && g.Unmatched.Allocations[0].PodUID == "pod-0"
	if unmatched != (lost == 1) {
		t.Fatalf("releases after the gap with nothing to release: %+v", g.Unmatched)
	}
}

// TestNextFramePassesOverPadding: the search for a valid frame after a
// torn-looking one finds none in the zeros of the padding, finds one after
// them, and finds none in bytes that only look like a frame's start.
func TestNextFramePassesOverPadding(t *testing.T) {
	rec := appendFrame(nil, []byte(`{"removed_resources":["x"]}`))
	b := make([]byte, 3*len(zeros)+7)
	if at := nextFrame(b, 0); at != -1 {
		t.Fatalf("a frame found at %d in zeros", at)
	}
	copy(b[len(zeros)+5:], rec)
	if at := nextFrame(b, 1); at != len(zeros)+5 {
		t.Fatalf("frame found at %d, want %d", at, len(zeros)+5)
	}
	if at := nextFrame(b, len(zeros)+6); at != -1 {
		t.Fatalf("a frame found at %d past the only one", at)
	}
	cut := append(make([]byte, 40), rec[:len(rec)-1]...)
	if at := nextFrame(cut, 0); at != -1 {
		t.Fatalf("a frame cut short found at %d", at)
	}
}

// BenchmarkScanTornTail: reading a journal whose last record is torn, which
// searches the rest of the file, padding and all, for a valid record: a
// journal of the default size and one of the largest.
func BenchmarkScanTornTail(b *testing.B) {
	e, err := encodeBatch(&Batch{Allocations: []Allocation{alloc("pod", "example.com/z", "dev-0")}})
	if err != nil {
		b.Fatal(err)
	}
	for _, size := range []int64{preallocation(DefaultCompactAt, 0), maxPrealloc} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			j := appendFrame(nil, []byte(`{"journal":1}`))
			for range 1000 {
				j = appendFrame(j, e.payload)
			}
			torn := appendFrame(nil, e.payload)
			clear(torn[frameHeader:])
			j = append(j, torn...)
			j = append(j, make([]byte, int(size)-len(j))...)
			b.SetBytes(size)
			for b.Loop() {
				if _, spans, torn := resync(j); !torn || len(spans) != 0 {
					b.Fatalf("torn %v, damage %v", torn, spans)
				}
			}
		})
	}
}
