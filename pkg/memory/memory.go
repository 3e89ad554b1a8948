// Package memory returns a process's free memory to the OS and says how
// much it gave back. The Go runtime returns freed memory lazily, and only
// after a garbage collection, which an idle process does not run; a service
// gives memory back once a burst of work is over (Giver: its own hook, then
// Release), so that its resident set follows the work it holds rather than
// the largest burst it has seen.
package memory

import (
	"runtime/debug"
	rtmetrics "runtime/metrics"
)

// Release runs a garbage collection and returns every freed page to the OS
// (debug.FreeOSMemory). It returns the memory the process held from the OS
// before and after (see Retained).
func Release() (before, after uint64) {
	before = Retained()
	debug.FreeOSMemory()
	return before, Retained()
}

// Retained is the memory the Go runtime has mapped and not returned to the
// OS, in bytes: a close estimate of its share of the resident set.
func Retained() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	rtmetrics.Read(s)
	total, released := s[0].Value.Uint64(), s[1].Value.Uint64()
	if released > total {
		return 0
	}
	return total - released
}

// HeapAllocs is the heap's cumulative allocations since the process
// started, in bytes: how much work it has done, whatever it still holds.
func HeapAllocs() uint64 {
	s := []rtmetrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}
