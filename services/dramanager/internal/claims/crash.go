package claims

import (
	"os"
	"syscall"
)

// CrashEnv is a testing hook: it names a step of a prepare or a release
// (one of the Crash* constants) at which the process kills itself with
// SIGKILL, so that a test can show that a kill at that step strands no
// claim. It is read once, at start; unset, as everywhere but in those
// tests, it does nothing.
const CrashEnv = "NODEPLUG_CRASH_AT"

// The steps CrashEnv names.
const (
	// CrashMarked: claim allocation wrote its marker, not yet the
	// allocation (package claimalloc).
	CrashMarked = "marked"
	// CrashAllocated: the allocation and the reservation are written
	// (package claimalloc).
	CrashAllocated = "allocated"
	// CrashReserved: Reserve returned; the intent does not hold the
	// claim's UID yet.
	CrashReserved = "reserved"
	// CrashCalling: the intent names the drivers; none is called yet.
	CrashCalling = "calling"
	// CrashPrepared: the drivers answered; nothing is committed.
	CrashPrepared = "prepared"
	// CrashCommitted: the prepare is committed, not yet answered.
	CrashCommitted = "committed"
	// CrashReleased: a release is committed; its unprepare is owed.
	CrashReleased = "released"
	// CrashUnprepared: a released claim's driver unprepared it; its
	// reservation is not removed yet.
	CrashUnprepared = "unprepared"
)

var crashAt = os.Getenv(CrashEnv)

// Crash kills the process with SIGKILL when CrashEnv names step.
func Crash(step string) {
	if crashAt == "" || crashAt != step {
		return
	}
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // until the signal lands
}
