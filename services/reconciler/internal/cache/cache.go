// Package cache holds the reconciler's two views of the world, as the
// kubelet's plugin manager does: the desired state of the world (DSW, the
// sockets the watcher reports) and the actual state of the world (ASW, the
// plugins registered with their handlers). Both are keyed by socket path. A
// socket's generation (its file identity, from the watcher) takes the place
// of the kubelet's per-Create UUID: a recreated socket has a new generation,
// a watcher restart does not change it.
//
// Neither cache knows anything of gRPC. Both are safe for concurrent use.
package cache

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// ErrEmptySocketPath is returned when a plugin has no socket path.
var ErrEmptySocketPath = fmt.Errorf("socket path is empty: %w", errdefs.ErrInvalidArgument)

// Socket is one DSW entry: a socket the watcher reported.
type Socket struct {
	Path       string
	Generation string
	// Observed is when the socket (this generation) was first seen.
	Observed time.Time
	// TraceContext is the W3C trace context of the live event that made the
	// entry (nil for snapshot entries); the register operation continues it.
	TraceContext map[string]string
}

// Plugin is one ASW entry: a plugin registered with a handler.
type Plugin struct {
	SocketPath string
	Generation string
	Type       string
	Name       string
	Endpoint   string
	Versions   []string
	Handler    Handler
}

// Handler registers plugins of one type. The reconciler calls Validate,
// Register and Deregister strictly one after another per socket path, never
// concurrently for the same socket; calls for different sockets run in
// parallel, so implementations must be safe for concurrent use.
type Handler interface {
	// Validate checks a plugin's name, endpoint and versions before
	// anything is recorded. Its error is told to the plugin.
	Validate(ctx context.Context, name, endpoint string, versions []string) error
	// Register makes the plugin usable. p carries the socket path and
	// generation, so registration can be idempotent downstream.
	Register(ctx context.Context, p Plugin) error
	// Deregister undoes Register. The plugin is not contacted.
	Deregister(ctx context.Context, p Plugin) error
}

// OrphanDeregisterer is implemented by handlers that keep registrations
// outside this process (the devicemanager's endpoints), which can outlive
// the reconciler's knowledge of them: registered by an earlier reconciler,
// or left by a deregistration that failed.
//
// DeregisterOrphans deregisters every such registration whose socket path
// and generation desired rejects, and returns how many it removed. desired
// holds for a socket in the desired state of the world. The reconciler
// calls it after the first snapshot, after a failed deregistration and
// after the handler reports that its downstream restarted; after an error
// it calls it again at its next pass.
type OrphanDeregisterer interface {
	DeregisterOrphans(ctx context.Context, desired func(socketPath, generation string) bool) (int, error)
}

// The optional capabilities below are how a handler tells the generic
// register loop what it needs beyond cache.Handler; the loop asks for them
// with a type assertion and knows no plugin type by name. A new plugin type
// implements those that apply to it and nothing in the loop changes.

// EndpointWaiter is implemented by handlers whose plugins' endpoints are
// dialled downstream and may appear after the registration socket, as a
// device plugin's may (the kubelet waits for it, up to its dial timeout).
// Before the handler's Register, the reconciler waits for such an endpoint
// that does not exist yet but may appear inside the allowed directories,
// holding no worker, for at most its Options.EndpointWait.
type EndpointWaiter interface {
	// EndpointMissing returns the error the registration fails with when
	// the endpoint did not appear within waited; it carries what the
	// kubelet tells the plugin (kubeletrules.Error).
	EndpointMissing(endpoint string, waited time.Duration) error
}

// EndpointKeyed is implemented by handlers whose downstream keys a
// registration by what the plugin named (its name and endpoint) rather
// than by its registration socket, as the devicemanager keys device plugin
// endpoints and DRA driver instances. When a socket is recreated, the
// registration of its new generation replaces the old one downstream only
// when Replaces says so; otherwise the reconciler deregisters the old one
// once the new one is registered. A handler without it keys by socket
// path: the new generation always replaces the old.
type EndpointKeyed interface {
	// Replaces reports whether registering p downstream replaces old, the
	// registration of an earlier generation of p's socket with the same
	// handler.
	Replaces(old, p Plugin) bool
}

// DownstreamReady is implemented by handlers whose registrations live in
// another process (the devicemanager, the dramanager). A registration the
// reconciler makes again without contacting the plugin (one it recovered
// from its last run) waits until DownstreamReady holds, rather than failing
// against a peer that is still starting and sending the plugin through
// GetInfo and NotifyRegistrationStatus again. Whoever wires the handler
// wakes the reconciler (Reconciler.Wake) each time its peer becomes
// reachable.
type DownstreamReady interface {
	DownstreamReady() bool
}

// DesiredStateOfWorld is the set of sockets that exist.
type DesiredStateOfWorld interface {
	// AddOrUpdate records a socket. It reports whether the entry changed
	// (new path or new generation); the same generation again keeps the
	// existing entry.
	AddOrUpdate(s Socket) (changed bool, err error)
	// Remove deletes the socket at path if its generation is generation (or
	// generation is empty). It reports whether an entry was removed.
	Remove(path, generation string) bool
	// Replace makes the DSW exactly sockets: entries with an unchanged
	// generation stay as they are. It returns the number of entries added,
	// changed and removed.
	Replace(sockets []Socket) (added, changed, removed int)
	Get(path string) (Socket, bool)
	Exists(path string) bool
	List() []Socket
	Len() int
}

// ActualStateOfWorld is the set of registered plugins.
type ActualStateOfWorld interface {
	// Add records p, replacing any entry for its socket path.
	Add(p Plugin) error
	Remove(path string)
	Get(path string) (Plugin, bool)
	// ExistsWithGeneration reports whether path is registered with
	// generation.
	ExistsWithGeneration(path, generation string) bool
	List() []Plugin
	Len() int
}

type dsw struct {
	mu      sync.RWMutex
	sockets map[string]Socket
}

var _ DesiredStateOfWorld = (*dsw)(nil)

// NewDesiredStateOfWorld returns an empty DSW.
func NewDesiredStateOfWorld() DesiredStateOfWorld {
	return &dsw{sockets: map[string]Socket{}}
}

func (d *dsw) AddOrUpdate(s Socket) (bool, error) {
	if s.Path == "" {
		return false, ErrEmptySocketPath
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.sockets[s.Path]; ok && old.Generation == s.Generation {
		return false, nil
	}
	d.sockets[s.Path] = s
	return true, nil
}

func (d *dsw) Remove(path, generation string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	old, ok := d.sockets[path]
	if !ok || (generation != "" && old.Generation != generation) {
		return false
	}
	delete(d.sockets, path)
	return true
}

func (d *dsw) Replace(sockets []Socket) (added, changed, removed int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	next := make(map[string]Socket, len(sockets))
	for _, s := range sockets {
		if s.Path == "" {
			continue
		}
		old, ok := d.sockets[s.Path]
		switch {
		case !ok:
			added++
			next[s.Path] = s
		case old.Generation != s.Generation:
			changed++
			next[s.Path] = s
		default:
			next[s.Path] = old
		}
	}
	for p := range d.sockets {
		if _, ok := next[p]; !ok {
			removed++
		}
	}
	d.sockets = next
	return added, changed, removed
}

func (d *dsw) Get(path string) (Socket, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	s, ok := d.sockets[path]
	return s, ok
}

func (d *dsw) Exists(path string) bool {
	_, ok := d.Get(path)
	return ok
}

func (d *dsw) List() []Socket {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return slices.Collect(maps.Values(d.sockets))
}

func (d *dsw) Len() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.sockets)
}

type asw struct {
	mu      sync.RWMutex
	plugins map[string]Plugin
}

var _ ActualStateOfWorld = (*asw)(nil)

// NewActualStateOfWorld returns an empty ASW.
func NewActualStateOfWorld() ActualStateOfWorld {
	return &asw{plugins: map[string]Plugin{}}
}

func (a *asw) Add(p Plugin) error {
	if p.SocketPath == "" {
		return ErrEmptySocketPath
	}
	if p.Handler == nil {
		return fmt.Errorf("plugin at socket %s has no handler: %w", p.SocketPath, errdefs.ErrInvalidArgument)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.plugins[p.SocketPath] = p
	return nil
}

func (a *asw) Remove(path string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.plugins, path)
}

func (a *asw) Get(path string) (Plugin, bool) {
	a.mu.RLock()
	defer a.mu.RUnlock()
	p, ok := a.plugins[path]
	return p, ok
}

func (a *asw) ExistsWithGeneration(path, generation string) bool {
	p, ok := a.Get(path)
	return ok && p.Generation == generation
}

func (a *asw) List() []Plugin {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return slices.Collect(maps.Values(a.plugins))
}

func (a *asw) Len() int {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return len(a.plugins)
}
