// Package status is the reconciler's published view of its sockets: one
// PluginStatus per socket, a revision that counts every change, and a hub
// that streams the changes to watchers (WatchPlugins). It also keeps the
// trace context that passes from an event, or a first attempt, to the
// operation that continues it.
//
// The control loop (package reconciler) writes to a Board; the API adapter
// reads from it. The Board decides nothing: it records what the loop tells
// it and publishes each change. It knows nothing of gRPC.
package status

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/clock"
)

// State is where a socket's registration stands.
type State int

// States of a socket.
const (
	// StatePending: known, not registered yet, or an operation is running.
	StatePending State = iota + 1
	// StateRegistered: registered with its handler and told so.
	StateRegistered
	// StateFailed: the last attempt failed; NextRetry says when the next is
	// due.
	StateFailed
)

func (s State) String() string {
	switch s {
	case StatePending:
		return "pending"
	case StateRegistered:
		return "registered"
	case StateFailed:
		return "failed"
	}
	return "unknown"
}

// PluginStatus is what the reconciler knows about one socket.
type PluginStatus struct {
	SocketPath     string
	State          State
	Name           string
	Type           string
	Endpoint       string
	Versions       []string
	Generation     string
	LastError      string
	NextRetry      time.Time
	LastTraceID    string
	LastTransition time.Time
	Failures       int
}

func (s PluginStatus) clone() PluginStatus {
	s.Versions = slices.Clone(s.Versions)
	return s
}

// Change is one entry of the WatchPlugins stream.
type Change struct {
	Removed  bool
	Plugin   PluginStatus
	Revision uint64
}

// changeOverhead is what a Change holds in a subscriber's queue besides its
// strings: the struct, its queue entry and the Versions slice header.
const changeOverhead = 384

// size is the bytes c holds in a subscriber's queue.
func (c Change) size() int {
	p := c.Plugin
	n := changeOverhead + len(p.SocketPath) + len(p.Name) + len(p.Type) + len(p.Endpoint) +
		len(p.Generation) + len(p.LastError) + len(p.LastTraceID)
	for _, v := range p.Versions {
		n += len(v) + 16
	}
	return n
}

// entry is one socket's status and the trace context of its current
// generation's first failed attempt, which retries link to.
type entry struct {
	PluginStatus
	firstAttempt trace.SpanContext
	// endpointDown: LastError is the note that the registered plugin's
	// endpoint stopped (EndpointStopped), not a failed attempt's error.
	endpointDown bool
}

// Board holds the statuses. Its methods are safe for concurrent use; every
// change is published in revision order, and a Watch snapshot is consistent
// with the changes that follow it.
//
// The writing methods take the socket's path and generation: news about a
// generation that a newer one has replaced is dropped.
type Board struct {
	clock    clock.Clock
	instance string

	mu       sync.Mutex
	entries  map[string]*entry
	revision uint64
	hub      *stream.Hub[Change]
	// deleteTrace holds, by socket path, the trace context of the DELETED
	// event that the unregistration continues.
	deleteTrace map[string]map[string]string
}

// New returns an empty board stamping transitions with clk (the wall clock
// when nil), with a new instance ID. Its watchers (WatchPlugins streams)
// are bounded by limits; zero fields take the stream package's defaults.
func New(clk clock.Clock, limits stream.Limits) *Board {
	if clk == nil {
		clk = clock.Real{}
	}
	return &Board{
		clock:       clk,
		instance:    uuid.NewString(),
		entries:     map[string]*entry{},
		hub:         stream.NewBoundedHub(limits, Change.size),
		deleteTrace: map[string]map[string]string{},
	}
}

// InstanceID identifies this reconciler process.
func (b *Board) InstanceID() string { return b.instance }

// List returns every socket's status, sorted by socket path.
func (b *Board) List() []PluginStatus {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.listLocked()
}

func (b *Board) listLocked() []PluginStatus {
	out := make([]PluginStatus, 0, len(b.entries))
	for _, e := range b.entries {
		out = append(out, e.clone())
	}
	slices.SortFunc(out, func(a, b PluginStatus) int { return cmp.Compare(a.SocketPath, b.SocketPath) })
	return out
}

// Get returns one socket's status.
func (b *Board) Get(path string) (PluginStatus, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.entries[path]
	if !ok {
		return PluginStatus{}, false
	}
	return e.clone(), true
}

// Paths returns the socket paths that have a status.
func (b *Board) Paths() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Collect(maps.Keys(b.entries))
}

// Watch returns a subscription that delivers every socket's status (one
// Change per socket, sorted by path, at the revision returned), then every
// change after them. The caller closes the subscription. It fails with an
// error wrapping stream.ErrTooManySubscribers (and
// errdefs.ErrResourceExhausted) when the board's limits leave no room.
func (b *Board) Watch() (uint64, *stream.Subscription[Change], error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	list := b.listLocked()
	snapshot := make([]Change, len(list))
	for i, p := range list {
		snapshot[i] = Change{Plugin: p, Revision: b.revision}
	}
	sub, err := b.hub.Join(snapshot)
	if err != nil {
		return 0, nil, fmt.Errorf("watch the plugins: %w", err)
	}
	return b.revision, sub, nil
}

// RegisterMetrics registers the gauges and counter of the board's
// watchers (WatchPlugins streams) with reg.
func (b *Board) RegisterMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodeplug_reconciler_watchers",
			Help: "Open WatchPlugins streams.",
		}, func() float64 { return float64(b.hub.Stats().Subscribers) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "nodeplug_reconciler_watcher_bytes",
			Help: "Bytes of changes the WatchPlugins streams hold, not yet sent to their clients.",
		}, func() float64 { return float64(b.hub.Stats().Held) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "nodeplug_reconciler_slow_watchers_dropped_total",
			Help: "WatchPlugins streams closed with RESOURCE_EXHAUSTED because they fell behind, or held the most when all of them together held their byte budget.",
		}, func() float64 { return float64(b.hub.Stats().Closed) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Close ends every subscription.
func (b *Board) Close() { b.hub.Close(nil) }

// Track makes sure the socket at path with generation has a status. A new
// generation starts over as pending (registered when registered says so),
// keeping what the last GetInfo said about the plugin until it is asked
// again.
func (b *Board) Track(path, generation string, registered bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.entries[path]
	if ok && e.Generation == generation {
		return
	}
	if !ok {
		e = &entry{}
		b.entries[path] = e
	}
	old := e.PluginStatus
	*e = entry{PluginStatus: PluginStatus{SocketPath: path, Generation: generation, State: StatePending, LastTransition: b.clock.Now(),
		Name: old.Name, Type: old.Type, Endpoint: old.Endpoint, Versions: old.Versions, LastTraceID: old.LastTraceID}}
	if registered {
		e.State = StateRegistered
	}
	b.publishLocked(false, e)
}

// Attempting records that a registration attempt started in span: the
// socket is pending, and its last trace is the span's. The first attempt of
// a generation is remembered, for retries to link to.
func (b *Board) Attempting(path, generation string, span trace.SpanContext, first bool) {
	b.update(path, generation, func(e *entry) {
		e.State = StatePending
		e.LastTraceID = span.TraceID().String()
		if first {
			e.firstAttempt = span
		}
	})
}

// FirstAttempt returns the span of the first failed registration attempt of
// the socket's current generation (invalid when there is none).
func (b *Board) FirstAttempt(path string) trace.SpanContext {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e, ok := b.entries[path]; ok {
		return e.firstAttempt
	}
	return trace.SpanContext{}
}

// Identified records what the plugin's GetInfo said.
func (b *Board) Identified(path, generation, name, typ, endpoint string, versions []string) {
	b.update(path, generation, func(e *entry) {
		e.Name, e.Type, e.Endpoint, e.Versions = name, typ, endpoint, slices.Clone(versions)
	})
}

// Registered records a successful registration: no error, no failures, no
// retry due.
func (b *Board) Registered(path, generation string) {
	b.update(path, generation, func(e *entry) {
		e.State = StateRegistered
		e.LastError, e.endpointDown = "", false
		e.Failures = 0
		e.NextRetry = time.Time{}
		e.firstAttempt = trace.SpanContext{}
	})
}

// EndpointStopped records that the endpoint behind the registered socket
// at path with generation stopped serving (its devicemanager stream
// ended): the registration stands, as in the kubelet, whose plugin manager
// keeps it while the socket file is there, but its last error says why its
// devices are not allocatable, so ListPlugins agrees with ListResources.
// Nothing changes for a socket that is not known and registered with that
// generation.
func (b *Board) EndpointStopped(path, generation, note string) {
	b.updateExisting(path, generation, func(e *entry) bool {
		if e.State != StateRegistered || (e.endpointDown && e.LastError == note) {
			return false
		}
		e.LastError, e.endpointDown = note, true
		return true
	})
}

// EndpointLive records that the endpoint behind the registered socket at
// path with generation serves again: the note EndpointStopped left goes.
func (b *Board) EndpointLive(path, generation string) {
	b.updateExisting(path, generation, func(e *entry) bool {
		if !e.endpointDown {
			return false
		}
		e.LastError, e.endpointDown = "", false
		return true
	})
}

// updateExisting changes the status of path, when it is known with
// generation, and publishes the change when f reports one.
func (b *Board) updateExisting(path, generation string, f func(e *entry) bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.entries[path]
	if !ok || e.Generation != generation || !f(e) {
		return
	}
	b.publishLocked(false, e)
}

// Failed records a failed attempt, the failures in a row so far and when
// the next attempt is due.
func (b *Board) Failed(path, generation string, err error, failures int, next time.Time) {
	b.update(path, generation, func(e *entry) {
		e.State = StateFailed
		e.LastError, e.endpointDown = err.Error(), false
		e.Failures = failures
		e.NextRetry = next
	})
}

// Unregistering records that the socket's registration is being undone in
// the trace traceID.
func (b *Board) Unregistering(path, generation, traceID string) {
	b.update(path, generation, func(e *entry) {
		e.State = StatePending
		e.LastTraceID = traceID
	})
}

// Traced records the trace of an operation that does not change the state
// (registering again with a handler).
func (b *Board) Traced(path, generation, traceID string) {
	b.update(path, generation, func(e *entry) { e.LastTraceID = traceID })
}

// Remove forgets the socket at path and publishes its removal.
func (b *Board) Remove(path string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.deleteTrace, path)
	e, ok := b.entries[path]
	if !ok {
		return
	}
	delete(b.entries, path)
	b.publishLocked(true, e)
}

// SetDeleteTrace keeps the trace context of the DELETED event for the
// socket at path, for the unregistration to continue.
func (b *Board) SetDeleteTrace(path string, carrier map[string]string) {
	if len(carrier) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.deleteTrace[path] = carrier
}

// TakeDeleteTrace returns and forgets the trace context SetDeleteTrace kept
// for path (nil when there is none).
func (b *Board) TakeDeleteTrace(path string) map[string]string {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.deleteTrace[path]
	delete(b.deleteTrace, path)
	return c
}

// update changes the status of path (creating it) and publishes the change,
// unless a newer generation took over the path.
func (b *Board) update(path, generation string, f func(e *entry)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.entries[path]
	if !ok {
		e = &entry{PluginStatus: PluginStatus{SocketPath: path, Generation: generation, State: StatePending, LastTransition: b.clock.Now()}}
		b.entries[path] = e
	}
	if e.Generation != generation {
		return
	}
	before := e.State
	f(e)
	if e.State != before {
		e.LastTransition = b.clock.Now()
	}
	b.publishLocked(false, e)
}

func (b *Board) publishLocked(removed bool, e *entry) {
	b.revision++
	b.hub.Publish(Change{Removed: removed, Plugin: e.clone(), Revision: b.revision})
}
