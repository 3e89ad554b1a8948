package manager

import "github.com/nodeplug/nodeplug/pkg/memory"

// GiveBack configures when the manager returns to the OS the memory that a
// burst of endpoint arrivals or departures took. The Go runtime returns
// freed memory lazily, and only after a garbage collection, which an idle
// devicemanager does not run: without this, the memory of a thousand
// plugins that came and went stays with the process for minutes. The
// give-back itself is nodeplug's one mechanism (memory.Giver), with the
// core's compaction as this service's hook; the trigger is memory's
// BurstRule: the manager counts its endpoint changes (arrivals,
// departures and resource removals) rather than sampling the heap
// (pkg/app's Settle), since it knows each one. Zero fields take the
// defaults (memory.DefaultBurstMinChanges and the others).
type GiveBack = memory.BurstRule
