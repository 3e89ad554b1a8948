// Package state is the console's view of nodeplug: it follows the
// services through their reader methods only (WatchSocketEvents,
// WatchPlugins, WatchResources, ListAllocations, and the dramanager's
// DRAService: WatchResourceSlices, ListDRADrivers, ListClaims), and the
// node-local API's Pods and pod Events with the reader's kubeconfig (list
// and watch), and keeps the latest snapshot of sockets, plugins,
// resources, allocations, DRA drivers, ResourceSlices, claims, pods and
// events, waking the live views on every change.
package state

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/signal"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	wv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
)

// The services, as Snapshot.Status names them.
const (
	Watcher       = "watcher"
	Reconciler    = "reconciler"
	DeviceManager = "devicemanager"
)

// Conns are the connections to the services.
type Conns struct {
	Watcher, Reconciler, DeviceManager grpc.ClientConnInterface
	// DRAManager is nodeplug-dramanager: DRA drivers, slices and claims.
	DRAManager grpc.ClientConnInterface
	// Kubeconfig is the node-local API's kubeconfig (the reader's), read
	// at each connection; empty: pods and events are not followed.
	Kubeconfig string
}

// Snapshot is what the console shows at one moment. Its messages are
// shared and must not be modified.
type Snapshot struct {
	Sockets     []*wv1.SocketEvent    // CREATED events of the sockets present, by path
	Plugins     []*rcv1.Plugin        // by socket path
	Resources   []*dmv1.Resource      // by name
	Allocations []*dmv1.Allocation    // by pod, container, resource
	DRADrivers  []*dmv1.DRADriver     // by name
	Slices      []*dmv1.ResourceSlice // by name
	Claims      []*dmv1.Claim         // by namespace, name
	// Pods are the node-local API's pods, by namespace and name; Events
	// the events about pods, oldest first (as podinfo.CompareEvents
	// orders them).
	Pods   []*corev1.Pod
	Events []*corev1.Event
	// PodsOff is set when the console does not follow the node-local API
	// (no kubeconfig given).
	PodsOff bool
	// DriversProblem and ClaimsProblem say why the last driver or claim
	// list failed ("" when it did not); the lists then keep what they
	// held before.
	DriversProblem, ClaimsProblem string
	// Status holds, per service, "" while its stream is synced, else why
	// not (connecting, or the last error).
	Status map[string]string
	// Revision grows with every change.
	Revision uint64
}

// State follows the services and holds the latest Snapshot. It is safe for
// concurrent use.
type State struct {
	conns   Conns
	log     *slog.Logger
	changed signal.Signal
	allocs  chan struct{} // asks the allocation lister for a new list
	dra     chan struct{} // asks for new DRA driver and claim lists
	// stopping is set once Run's context ends.
	stopping atomic.Bool

	mu        sync.Mutex
	sockets   map[string]*wv1.SocketEvent
	plugins   map[string]*rcv1.Plugin
	resources map[string]*dmv1.Resource
	allocList []*dmv1.Allocation
	slices    map[string]*dmv1.ResourceSlice
	drivers   []*dmv1.DRADriver
	claims    []*dmv1.Claim
	// driversProblem and claimsProblem: see Snapshot.
	driversProblem, claimsProblem string
	pods                          map[string]*corev1.Pod   // by namespace/name
	events                        map[string]*corev1.Event // by namespace/name
	// podList and eventList are pods and events sorted, nil after a change.
	podList   []*corev1.Pod
	eventList []*corev1.Event
	status    map[string]string
	rev       uint64
}

// New returns a State over conns; Run follows the services.
func New(conns Conns, log *slog.Logger) *State {
	s := &State{
		conns: conns, log: log, allocs: make(chan struct{}, 1), dra: make(chan struct{}, 1),
		sockets: map[string]*wv1.SocketEvent{}, plugins: map[string]*rcv1.Plugin{}, resources: map[string]*dmv1.Resource{},
		slices: map[string]*dmv1.ResourceSlice{}, pods: map[string]*corev1.Pod{}, events: map[string]*corev1.Event{},
		status: map[string]string{Watcher: "connecting", Reconciler: "connecting", DeviceManager: "connecting", DRA: "connecting"},
	}
	if conns.Kubeconfig != "" {
		s.status[API] = "connecting"
	}
	return s
}

// Changed returns a channel closed at the next change.
func (s *State) Changed() <-chan struct{} { return s.changed.C() }

// Snapshot returns the current state.
func (s *State) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	snap := Snapshot{Status: map[string]string{}, Revision: s.rev, Allocations: slices.Clone(s.allocList)}
	for k, v := range s.status {
		snap.Status[k] = v
	}
	snap.Sockets = sortedValues(s.sockets)
	snap.Plugins = sortedValues(s.plugins)
	snap.Resources = sortedValues(s.resources)
	snap.Slices = sortedValues(s.slices)
	snap.DRADrivers, snap.Claims = slices.Clone(s.drivers), slices.Clone(s.claims)
	snap.DriversProblem, snap.ClaimsProblem = s.driversProblem, s.claimsProblem
	snap.Pods, snap.Events, snap.PodsOff = s.podsSorted(), s.eventsSorted(), s.conns.Kubeconfig == ""
	return snap
}

func sortedValues[T any](m map[string]T) []T {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]T, 0, len(keys))
	for _, k := range keys {
		out = append(out, m[k])
	}
	return out
}

// update runs f under the lock and wakes the views.
func (s *State) update(f func()) {
	s.mu.Lock()
	f()
	s.rev++
	s.mu.Unlock()
	s.changed.Broadcast()
}

func (s *State) setStatus(svc, msg string) {
	if s.stopping.Load() {
		return // the streams end because the console stops
	}
	s.mu.Lock()
	same := s.status[svc] == msg
	s.mu.Unlock()
	if !same {
		s.log.Warn("stream to the "+svc+" is down; retrying", "reason", msg)
		s.update(func() { s.status[svc] = msg })
	}
}

// synced is logged once per (re)connection of a stream.
func (s *State) synced(svc string, items int) {
	s.log.Info("following the "+svc, "items", items)
}

// Run follows the services (and the node-local API) until ctx ends, reconnecting after every
// stream error.
func (s *State) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	follow := []func(context.Context) error{s.watchSockets, s.watchPlugins, s.watchResources, s.watchSlices}
	if s.conns.Kubeconfig != "" {
		follow = append(follow, s.followAPI)
	}
	for _, f := range follow {
		wg.Go(func() { s.retry(ctx, f) })
	}
	wg.Go(func() { s.listAllocations(ctx) })
	wg.Go(func() { s.listDRA(ctx) })
	context.AfterFunc(ctx, func() { s.stopping.Store(true) })
	wg.Wait()
	return nil
}

// retry runs one watch again and again, waiting between failures (at most
// 2 s).
func (s *State) retry(ctx context.Context, watch func(context.Context) error) {
	wait := 100 * time.Millisecond
	for ctx.Err() == nil {
		start := time.Now()
		err := watch(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > 10*time.Second {
			wait = 100 * time.Millisecond
		}
		s.log.Debug("watch ended", "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// describe turns a stream error into the status line of a service.
func describe(err error) string {
	if errors.Is(err, io.EOF) {
		return "stream ended"
	}
	st := status.Convert(err)
	msg := st.Message()
	if st.Code() == codes.Unavailable {
		if i := strings.LastIndex(msg, ": "); i >= 0 && strings.Contains(msg, "dial") {
			msg = msg[i+2:]
		}
		return "unreachable: " + strings.Trim(msg, `"`)
	}
	return st.Code().String() + ": " + msg
}
