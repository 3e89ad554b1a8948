package reconciler

import (
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/checkpoint"
)

// The registrations file (package checkpoint) holds every plugin this
// reconciler registered and told so. A reconciler that starts again adopts
// those whose sockets still have the same generation in the watcher's first
// snapshot: into the ASW, and registered with their handlers again (step 2
// of reconcilePath), without GetInfo or NotifyRegistrationStatus. The rest
// are forgotten; what their handlers' peers still hold of them is swept as
// orphans.

// recoveredPlugins returns the file's registrations as ASW entries, each
// with its type's handler; registrations of a type no handler serves are
// dropped.
func recoveredPlugins(ckpt *checkpoint.File, handlers map[string]cache.Handler) []cache.Plugin {
	if ckpt == nil {
		return nil
	}
	var out []cache.Plugin
	for _, reg := range ckpt.Loaded() {
		h := handlers[reg.Type]
		if h == nil {
			continue
		}
		out = append(out, cache.Plugin{SocketPath: reg.SocketPath, Generation: reg.Generation, Type: reg.Type,
			Name: reg.Name, Endpoint: reg.Endpoint, Versions: reg.Versions, Handler: h})
	}
	return out
}

// adoptRecoveredLocked adopts the recovered registrations whose sockets are
// desired with the same generation, once, at the first snapshot. Called
// with r.mu held.
func (r *Reconciler) adoptRecoveredLocked() {
	recovered := r.recovered
	r.recovered = nil
	if r.ckpt == nil || len(r.ckpt.Loaded()) == 0 {
		return
	}
	adopted := 0
	for _, p := range recovered {
		if !r.desired(p.SocketPath, p.Generation) {
			continue
		}
		if err := r.asw.Add(p); err != nil {
			continue
		}
		r.status.Track(p.SocketPath, p.Generation, true)
		r.status.Identified(p.SocketPath, p.Generation, p.Name, p.Type, p.Endpoint, p.Versions)
		r.reregister[p.SocketPath] = true
		adopted++
	}
	// What was not adopted is forgotten: the file now holds exactly the
	// ASW's notified registrations.
	for _, reg := range r.ckpt.Loaded() {
		if !r.asw.ExistsWithGeneration(reg.SocketPath, reg.Generation) {
			r.ckpt.Delete(reg.SocketPath, reg.Generation)
		}
	}
	r.log.Info("registrations recovered from the last run", "file", r.ckpt.Path(), "recorded", len(r.ckpt.Loaded()), "adopted", adopted,
		"dropped", len(r.ckpt.Loaded())-adopted)
}

// recorded puts p, registered and told so, in the registrations file.
func (r *Reconciler) recorded(p cache.Plugin) {
	if r.ckpt == nil {
		return
	}
	r.ckpt.Put(checkpoint.Registration{SocketPath: p.SocketPath, Generation: p.Generation, Type: p.Type, Name: p.Name, Endpoint: p.Endpoint, Versions: p.Versions})
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
