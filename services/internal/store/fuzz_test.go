package store

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// FuzzUnmarshal: decoding never panics; what it refuses wraps ErrCorrupt;
// what it accepts encodes again and decodes to the same record counts.
func FuzzUnmarshal(f *testing.F) {
	good, err := marshal(sample())
	if err != nil {
		f.Fatal(err)
	}
	empty, err := marshal(&Data{Resources: []Resource{}, Allocations: []Allocation{}})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		string(good), string(empty), "", "{}", "null", "not json",
		string(good[:len(good)/2]),
		strings.Replace(string(good), `"d0"`, `"d9"`, 1),
		strings.Replace(string(good), `"version":2`, `"version":1`, 1),
		strings.Replace(string(good), `"version":2`, `"version":3`, 1),
		`{"version":1,"checksum":"sha256:00"}`,
		`{"version":1,"checksum":"","data":null}`,
		`{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":1}`,
		string(good) + "trailing",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := unmarshal(b)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v does not wrap ErrCorrupt", err)
			}
			if d != nil {
				t.Fatalf("data %+v with error %v", d, err)
			}
			return
		}
		again, err := marshal(d)
		if err != nil {
			t.Fatalf("accepted data does not encode: %v", err)
		}
		d2, err := unmarshal(again)
		if err != nil {
			t.Fatalf("accepted data, encoded again, is refused: %v", err)
		}
		if len(d2.Resources) != len(d.Resources) || len(d2.Allocations) != len(d.Allocations) {
			t.Fatalf("round trip changed the records: %d/%d, %d/%d", len(d2.Resources), len(d.Resources), len(d2.Allocations), len(d.Allocations))
		}
	})
}

// FuzzJournal: whatever a journal file holds, Load never panics, fails
// only by moving files aside, drops nothing quietly that a valid record
// follows, and a second Load of what it left is quiet and restores the
// same state.
func FuzzJournal(f *testing.F) {
	header := appendFrame(nil, []byte(`{"journal":1}`))
	e, err := encodeBatch(&Batch{Allocations: []Allocation{alloc("p", "r", "d")}, RemovedResources: []string{"x"}})
	if err != nil {
		f.Fatal(err)
	}
	rec := appendFrame(nil, e.payload)
	whole := append(append(append([]byte(nil), header...), rec...), rec...)
	// A middle record's payload zeroed, the record after it whole.
	zeroed := append(append(append(append([]byte(nil), header...), rec[:frameHeader]...), make([]byte, len(rec)-frameHeader)...), rec...)
	for _, s := range [][]byte{
		nil, header, whole, whole[:len(whole)-4], append(append([]byte(nil), whole...), 0, 0, 0), zeroed,
		append(append([]byte(nil), zeroed...), make([]byte, 600)...),
		[]byte(`{"kind":"SomethingElse"}`), append(append([]byte(nil), header...), []byte("not a frame at all")...),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := testutil.TempDir(t)
		if err := os.WriteFile(journalPath(Path(dir), 1), b, 0o600); err != nil {
			t.Fatal(err)
		}
		j := New(dir, Options{})
		d, err := j.Load()
		if !OnlyCorruptions(err) {
			t.Fatalf("Load: %v", err)
		}
		if _, good, _, _ := splitFrames(b); err == nil {
			if at := nextFrame(b, good+1); at >= 0 {
				t.Fatalf("a valid frame at offset %d after the %d bytes kept was dropped quietly", at, good)
			}
		}
		if err := j.Flush(); err != nil {
			t.Fatal(err)
		}
		j2 := New(dir, Options{})
		d2, err := j2.Load()
		if err != nil {
			t.Fatalf("second Load: %v", err)
		}
		_ = j2.Flush()
		n := func(d *Data) int {
			if d == nil {
				return 0
			}
			return len(d.Allocations) + len(d.Resources)
		}
		if n(d) != n(d2) {
			t.Fatalf("first Load kept %d records, second %d", n(d), n(d2))
		}
	})
}
