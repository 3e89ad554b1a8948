package reconciler

import (
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// The registrations file (package checkpoint) holds every plugin this
// reconciler registered and told so. A reconciler that starts again adopts
// those whose sockets still have the same generation in the watcher's first
// snapshot: into the ASW, and registered with their handlers again (step 2
// of reconcilePath), without GetInfo or NotifyRegistrationStatus. The rest
// are forgotten; what their handlers' peers still hold of them is swept as
// orphans.

// adoptRecoveredLocked adopts, once, at the first snapshot, the
// registrations of the file whose sockets are desired with the same
// generation and whose type a handler serves; the file forgets the rest.
// Called with r.mu held.
func (r *Reconciler) adoptRecoveredLocked() {
	if r.ckpt == nil {
		return
	}
	loaded := r.ckpt.Loaded()
	if len(loaded) == 0 {
		return
	}
	adopted := 0
	for _, p := range loaded {
		p.Handler = r.handlers[p.Type]
		if p.Handler == nil || !r.desired(p.SocketPath, p.Generation) || r.asw.Add(p) != nil {
			r.ckpt.Delete(p.SocketPath, p.Generation)
			continue
		}
		r.status.Track(p.SocketPath, p.Generation, true)
		r.status.Identified(p.SocketPath, p.Generation, p.Name, p.Type, p.Endpoint, p.Versions)
		r.reregister[p.SocketPath] = true
		adopted++
	}
	r.log.Info("registrations recovered from the last run", "file", r.ckpt.Path(), "recorded", len(loaded), "adopted", adopted,
		"dropped", len(loaded)-adopted)
}

// recorded puts p, registered and told so, in the registrations file.
func (r *Reconciler) recorded(p cache.Plugin) {
	if r.ckpt == nil {
		return
	}
	r.ckpt.Put(p)
}

// forgotten takes p's registration out of the registrations file.
func (r *Reconciler) forgotten(p cache.Plugin) {
	if r.ckpt == nil {
		return
	}
	r.ckpt.Delete(p.SocketPath, p.Generation)
}

// downstreamReady reports whether p's handler can take a registration
// made again now: its peer is reachable (cache.DownstreamReady), or it
// has none.
func downstreamReady(p cache.Plugin) bool {
	d, ok := p.Handler.(cache.DownstreamReady)
	return !ok || d.DownstreamReady()
}
