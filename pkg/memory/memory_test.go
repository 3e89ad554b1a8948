package memory

import "testing"

var sink [][]byte

// TestReleaseReturnsFreedMemory: memory a burst allocated and let go is
// returned, and the allocations are counted.
func TestReleaseReturnsFreedMemory(t *testing.T) {
	a0 := HeapAllocs()
	for range 256 {
		sink = append(sink, make([]byte, 64<<10)) // 16 MiB
	}
	if got := HeapAllocs() - a0; got < 16<<20 {
		t.Fatalf("HeapAllocs grew by %d bytes over a 16 MiB burst", got)
	}
	held := Retained()
	sink = nil
	before, after := Release()
	if before < 16<<20 || held < 16<<20 {
		t.Fatalf("retained %d (and %d just before Release) while holding 16 MiB", held, before)
	}
	if after >= before || before-after < 8<<20 {
		t.Fatalf("Release returned %d bytes of a 16 MiB burst (before %d, after %d)", before-after, before, after)
	}
}
