package store

import (
	"errors"
	"strings"
	"testing"
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
		strings.Replace(string(good), `"version":1`, `"version":2`, 1),
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
