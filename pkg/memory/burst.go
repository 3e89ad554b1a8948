package memory

import "time"

// BurstRule says when the memory a burst of changes took goes back to the
// OS, for a service that counts its changes (the devicemanager's endpoint
// arrivals and departures) rather than sampling the heap (pkg/app's
// Settle): once enough changes came, none has come for a while, and the
// last give-back is not too recent. Zero fields take the defaults.
type BurstRule struct {
	// MinChanges is how many changes make a burst (default 64): fewer are
	// not worth a collection.
	MinChanges int
	// Quiet is how long no change must come for the burst to have
	// settled (default 1 s).
	Quiet time.Duration
	// Interval is the least time between two give-backs (default 10 s);
	// a burst that settles sooner waits for it.
	Interval time.Duration
}

// Defaults of BurstRule.
const (
	DefaultBurstMinChanges = 64
	DefaultBurstQuiet      = time.Second
	DefaultBurstInterval   = 10 * time.Second
)

// WithDefaults returns r with its zero fields set to the defaults.
func (r BurstRule) WithDefaults() BurstRule {
	if r.MinChanges <= 0 {
		r.MinChanges = DefaultBurstMinChanges
	}
	if r.Quiet <= 0 {
		r.Quiet = DefaultBurstQuiet
	}
	if r.Interval <= 0 {
		r.Interval = DefaultBurstInterval
	}
	return r
}

// Burst tracks the changes since memory was last given back and says, by
// its BurstRule, when they have settled. It keeps no clock of its own:
// callers pass the time, so that a timer or a test can drive it. It is not
// safe for concurrent use: its caller guards it.
type Burst struct {
	rule     BurstRule
	changes  int       // since the last give-back
	last     time.Time // of the last change
	lastGive time.Time // zero before the first give-back
}

// NewBurst returns a Burst with no changes, by rule (its defaults filled).
func NewBurst(rule BurstRule) *Burst { return &Burst{rule: rule.WithDefaults()} }

// Changed records n changes at now. It reports whether a burst has just
// become pending, so that the caller can make sure someone waits for Due.
func (b *Burst) Changed(now time.Time, n int) (started bool) {
	if n <= 0 {
		return false
	}
	was := b.pending()
	b.changes += n
	b.last = now
	return !was && b.pending()
}

func (b *Burst) pending() bool { return b.changes >= b.rule.MinChanges }

// Due returns when the pending burst may be given back: Quiet after its
// last change, and not sooner than Interval after the last give-back. ok
// is false when no burst is pending.
func (b *Burst) Due() (at time.Time, ok bool) {
	if !b.pending() {
		return time.Time{}, false
	}
	at = b.last.Add(b.rule.Quiet)
	if !b.lastGive.IsZero() {
		if limit := b.lastGive.Add(b.rule.Interval); limit.After(at) {
			at = limit
		}
	}
	return at, true
}

// Take reports whether a pending burst is due at now; if so it counts the
// burst as given back (the caller gives it) and returns how many changes
// it held.
func (b *Burst) Take(now time.Time) (changes int, ok bool) {
	at, pending := b.Due()
	if !pending || now.Before(at) {
		return 0, false
	}
	changes = b.changes
	b.changes = 0
	b.lastGive = now
	return changes, true
}
