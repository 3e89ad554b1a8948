package store

import (
	"encoding/json"
	"testing"
	"time"
)

// TestAppendAllocationIsJSON: the records of Allocate and Release are
// encoded directly, byte for byte as encoding/json encodes them, so that
// journals and snapshots read the same whichever wrote them; what the
// direct encoding does not handle goes to encoding/json.
func TestAppendAllocationIsJSON(t *testing.T) {
	at := time.Date(2026, 12, 1, 3, 4, 5, 600700800, time.UTC)
	base := Allocation{PodUID: "pod-1", ContainerName: "c", ResourceName: "example.com/gpu", DeviceIDs: []string{"d0", "d1"},
		Response: []byte{10, 3, 'x', 'y', 'z', 0, 255}, TraceID: "0123456789abcdef0123456789abcdef", Allocated: at}
	for _, tc := range []struct {
		name string
		edit func(a *Allocation)
	}{
		{"plain", func(*Allocation) {}},
		{"pod named", func(a *Allocation) { a.PodNamespace, a.PodName = "ns", "name" }},
		{"no devices (nil)", func(a *Allocation) { a.DeviceIDs = nil }},
		{"no devices (empty)", func(a *Allocation) { a.DeviceIDs = []string{} }},
		{"no response (nil)", func(a *Allocation) { a.Response = nil }},
		{"empty response", func(a *Allocation) { a.Response = []byte{} }},
		{"no trace", func(a *Allocation) { a.TraceID = "" }},
		{"container kind", func(a *Allocation) { a.ContainerKind = "init" }},
		{"zero time", func(a *Allocation) { a.Allocated = time.Time{} }},
		{"local zone", func(a *Allocation) { a.Allocated = at.In(time.FixedZone("x", 5*3600+30*60)) }},
		{"western zone", func(a *Allocation) { a.Allocated = at.In(time.FixedZone("y", -11*3600)) }},
		{"year 10000", func(a *Allocation) { a.Allocated = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }},
		{"HTML characters", func(a *Allocation) { a.PodName = "<a&b>" }},
		{"quote and backslash", func(a *Allocation) { a.ContainerName = `c"\` }},
		{"control character", func(a *Allocation) { a.DeviceIDs = []string{"d\n0"} }},
		{"non-ASCII", func(a *Allocation) { a.ResourceName = "example.com/gpü\u2028" }},
		{"invalid UTF-8", func(a *Allocation) { a.PodUID = "pod-\xff" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := base
			a.DeviceIDs = append([]string(nil), base.DeviceIDs...)
			tc.edit(&a)
			checkEncoding(t, &a)
		})
	}
}

func checkEncoding(t *testing.T, a *Allocation) {
	t.Helper()
	want, werr := json.Marshal(a)
	got, err := appendAllocation([]byte("prefix"), a)
	if (err != nil) != (werr != nil) {
		t.Fatalf("error %v; encoding/json: %v", err, werr)
	}
	if err == nil && string(got) != "prefix"+string(want) {
		t.Fatalf("encoded\n%s\nencoding/json\nprefix%s", got, want)
	}
	k := a.Key()
	wantKey, _ := json.Marshal(k)
	if gotKey, err := appendKey(nil, &k); err != nil || string(gotKey) != string(wantKey) {
		t.Fatalf("key encoded %s, %v; encoding/json %s", gotKey, err, wantKey)
	}
}

// FuzzAppendAllocation: whatever the strings, bytes and time, the direct
// encoding is encoding/json's.
func FuzzAppendAllocation(f *testing.F) {
	f.Add("pod", "ns", "name", "c", "example.com/r", "d0", []byte{1, 2}, "trace", int64(1764558245), int64(5), 0)
	f.Add("<pod>", "", "", "c\n", "r&", "d\x00", []byte(nil), "", int64(-62135596800), int64(0), -3600)
	f.Add("p", "", "", "c", "r", "", []byte{}, "", int64(253402300800), int64(999999999), 86399)
	f.Fuzz(func(t *testing.T, pod, ns, name, container, resource, device string, resp []byte, trace string, sec, nsec int64, zone int) {
		a := Allocation{PodUID: pod, PodNamespace: ns, PodName: name, ContainerName: container, ResourceName: resource,
			DeviceIDs: []string{device}, Response: resp, TraceID: trace, Allocated: time.Unix(sec, nsec).In(time.FixedZone("z", zone%(48*3600)))}
		checkEncoding(t, &a)
	})
}

// BenchmarkEncodeBatch measures encoding one Allocate's record and one
// Release's, as Append does before it takes the lock.
func BenchmarkEncodeBatch(b *testing.B) {
	a := benchData(8, 1).Allocations[0]
	b.ReportAllocs()
	for range b.N {
		if _, err := encodeBatch(&Batch{Allocations: []Allocation{a}}); err != nil {
			b.Fatal(err)
		}
		if _, err := encodeBatch(&Batch{RemovedAllocations: []AllocationKey{a.Key()}}); err != nil {
			b.Fatal(err)
		}
	}
}
