package reconciler

import (
	"context"
	"log/slog"

	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// orphanCheck is when to look for orphans; guarded by Reconciler.mu.
type orphanCheck struct {
	due     bool // look at the next pass (once synced)
	failing bool // the last look failed: warn once per failure streak
}

// orphansDue reports whether this pass looks for orphans, and clears the
// request. Nothing is looked for before the first snapshot: until then
// every registration would look orphaned.
func (r *Reconciler) orphansDue() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	due := r.orphans.due && r.synced
	if due {
		r.orphans.due = false
	}
	return due
}

// orphansLater asks the next pass to look for orphans.
func (r *Reconciler) orphansLater() {
	r.mu.Lock()
	r.orphans.due = true
	r.mu.Unlock()
}

// deregisterOrphans asks every handler that keeps registrations elsewhere to
// deregister those whose sockets are gone, in the background.
func (r *Reconciler) deregisterOrphans(ctx context.Context) {
	for typ, h := range r.handlers {
		o, ok := h.(cache.OrphanDeregisterer)
		if !ok {
			continue
		}
		r.bg.Add(1)
		go func() {
			defer r.bg.Done()
			n, err := o.DeregisterOrphans(ctx, r.kept)
			if err != nil && ctx.Err() == nil {
				r.mu.Lock()
				r.orphans.due = true
				warn := !r.orphans.failing
				r.orphans.failing = true
				r.mu.Unlock()
				lvl := slog.LevelDebug
				if warn {
					lvl = slog.LevelWarn
				}
				r.log.Log(ctx, lvl, "deregistering registrations whose sockets are gone failed; retrying at the next pass", "type", typ, "removed", n, "error", err)
				return
			}
			r.mu.Lock()
			r.orphans.failing = false
			r.mu.Unlock()
			if n > 0 {
				r.log.Info("deregistered registrations whose sockets are gone", "type", typ, "removed", n)
			}
		}()
	}
}

// kept reports whether the downstream registration of the socket at path
// with generation is to stay: the socket is desired, or it is the ASW's
// registration of a socket recreated meanwhile, which stays in place until
// the new generation replaces it (the register operation deregisters it if
// that fails).
func (r *Reconciler) kept(path, generation string) bool {
	return r.desired(path, generation) || r.asw.ExistsWithGeneration(path, generation)
}
