package manager

import "time"

// GiveBack configures when the manager returns to the OS the memory that a
// burst of endpoint arrivals or departures took. The Go runtime returns
// freed memory lazily, and only after a garbage collection, which an idle
// devicemanager does not run: without this, the memory of a thousand
// plugins that came and went stays with the process for minutes. The
// give-back itself is nodeplug's one mechanism (memory.Giver), with the
// core's compaction as this service's hook; what is the manager's own is
// the trigger: it counts its endpoint changes rather than sampling the
// heap (pkg/app's Settle), since it knows each one. Zero fields take the
// defaults.
type GiveBack struct {
	// MinChanges is how many endpoint arrivals, departures and resource
	// removals make a burst (default 64): fewer are not worth a collection.
	MinChanges int
	// Quiet is how long no such change must happen for the burst to have
	// settled (default 1 s).
	Quiet time.Duration
	// Interval is the least time between two give-backs (default 10 s);
	// a burst that settles sooner waits for it.
	Interval time.Duration
}

// Defaults of GiveBack.
const (
	DefaultGiveBackMinChanges = 64
	DefaultGiveBackQuiet      = time.Second
	DefaultGiveBackInterval   = 10 * time.Second
)

func (c GiveBack) withDefaults() GiveBack {
	if c.MinChanges <= 0 {
		c.MinChanges = DefaultGiveBackMinChanges
	}
	if c.Quiet <= 0 {
		c.Quiet = DefaultGiveBackQuiet
	}
	if c.Interval <= 0 {
		c.Interval = DefaultGiveBackInterval
	}
	return c
}

// burst tracks the changes since memory was last given back and says when
// they have settled. It keeps no clock of its own: callers pass the time,
// so that it can be driven by a timer or by a test. It is not safe for
// concurrent use (the manager guards it with its mutex).
type burst struct {
	cfg      GiveBack
	changes  int       // since the last give-back
	last     time.Time // of the last change
	lastGive time.Time // zero before the first give-back
}

func newBurst(cfg GiveBack) *burst { return &burst{cfg: cfg.withDefaults()} }

// changed records n changes at now. It reports whether a burst has just
// become pending, so that the caller can make sure someone waits for due.
func (b *burst) changed(now time.Time, n int) (started bool) {
	if n <= 0 {
		return false
	}
	was := b.pending()
	b.changes += n
	b.last = now
	return !was && b.pending()
}

func (b *burst) pending() bool { return b.changes >= b.cfg.MinChanges }

// due returns when the pending burst may be given back: Quiet after its
// last change, and not sooner than Interval after the last give-back. ok
// is false when no burst is pending.
func (b *burst) due() (at time.Time, ok bool) {
	if !b.pending() {
		return time.Time{}, false
	}
	at = b.last.Add(b.cfg.Quiet)
	if !b.lastGive.IsZero() {
		if limit := b.lastGive.Add(b.cfg.Interval); limit.After(at) {
			at = limit
		}
	}
	return at, true
}

// take reports whether a pending burst is due at now; if so it counts the
// burst as given back (the caller does it) and returns how many changes it
// held.
func (b *burst) take(now time.Time) (changes int, ok bool) {
	at, pending := b.due()
	if !pending || now.Before(at) {
		return 0, false
	}
	changes = b.changes
	b.changes = 0
	b.lastGive = now
	return changes, true
}
