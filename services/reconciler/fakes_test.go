package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/nodeplug/nodeplug/internal/testutil"
	devicemanagerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	watcherv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/watcher/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
)

// serve serves s on a Unix socket at path until the test ends.
func serve(t *testing.T, path string, register func(s *grpc.Server)) {
	t.Helper()
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := rpcutil.NewServer(slog.New(slog.DiscardHandler))
	register(s)
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(); <-done })
}

// fakeWatcher serves the watcher's API over sockets the test reports.
type fakeWatcher struct {
	watcherv1.UnimplementedWatcherServiceServer

	mu       sync.Mutex
	instance string
	revision uint64
	sockets  map[string]string // path → generation
	subs     map[chan *watcherv1.WatchSocketEventsResponse]struct{}
	stop     chan struct{}
	streams  int // streams that got past their snapshot
}

func newFakeWatcher(t *testing.T, path string) *fakeWatcher {
	w := &fakeWatcher{instance: uuid.NewString(), sockets: map[string]string{}, subs: map[chan *watcherv1.WatchSocketEventsResponse]struct{}{}, stop: make(chan struct{})}
	serve(t, path, func(s *grpc.Server) { watcherv1.RegisterWatcherServiceServer(s, w) })
	t.Cleanup(func() { w.mu.Lock(); close(w.stop); w.stop = make(chan struct{}); w.mu.Unlock() })
	return w
}

func (w *fakeWatcher) WatchSocketEvents(_ *watcherv1.WatchSocketEventsRequest, srv grpc.ServerStreamingServer[watcherv1.WatchSocketEventsResponse]) error {
	w.mu.Lock()
	id, stop := w.instance, w.stop
	var snap []*watcherv1.WatchSocketEventsResponse
	for _, p := range slices.Sorted(maps.Keys(w.sockets)) {
		snap = append(snap, &watcherv1.WatchSocketEventsResponse{InstanceId: id, Item: &watcherv1.WatchSocketEventsResponse_Event{Event: &watcherv1.SocketEvent{
			Type: watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED, Path: bounds.PathText(p), PathBytes: bounds.PathBytes(p), Generation: w.sockets[p], Revision: w.revision, Snapshot: true, ObservedTime: timestamppb.Now(),
		}}})
	}
	snap = append(snap, &watcherv1.WatchSocketEventsResponse{InstanceId: id, Item: &watcherv1.WatchSocketEventsResponse_Synced{Synced: &watcherv1.Synced{Revision: w.revision, SocketCount: uint32(len(w.sockets))}}})
	ch := make(chan *watcherv1.WatchSocketEventsResponse, 100000)
	w.subs[ch] = struct{}{}
	w.mu.Unlock()
	defer func() { w.mu.Lock(); delete(w.subs, ch); w.mu.Unlock() }()
	for _, m := range snap {
		if err := srv.Send(m); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.streams++
	w.mu.Unlock()
	for {
		select {
		case m := <-ch:
			if err := srv.Send(m); err != nil {
				return err
			}
		case <-stop:
			return fmt.Errorf("watcher restarting: %w", errdefs.ErrUnavailable)
		case <-srv.Context().Done():
			return srv.Context().Err()
		}
	}
}

func (w *fakeWatcher) broadcastLocked(ev *watcherv1.SocketEvent) {
	w.revision++
	ev.Revision = w.revision
	ev.ObservedTime = timestamppb.Now()
	for ch := range w.subs {
		ch <- &watcherv1.WatchSocketEventsResponse{InstanceId: w.instance, Item: &watcherv1.WatchSocketEventsResponse_Event{Event: ev}}
	}
}

// eventTrace starts and ends a root span, as the watcher does per event,
// and returns its carrier and trace ID.
func eventTrace(name string) (map[string]string, string) {
	ctx, span := telemetry.Tracer("fakewatcher").Start(context.Background(), name)
	defer span.End()
	return telemetry.Inject(ctx), telemetry.TraceID(ctx)
}

// Created reports the socket at path (stat'ed for its generation) and
// returns the event's trace ID.
func (w *fakeWatcher) Created(t *testing.T, path string) string {
	t.Helper()
	gen := testutil.Generation(t, path)
	carrier, traceID := eventTrace("watcher.created")
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sockets[path] = gen
	w.broadcastLocked(&watcherv1.SocketEvent{Type: watcherv1.SocketEventType_SOCKET_EVENT_TYPE_CREATED, Path: bounds.PathText(path), PathBytes: bounds.PathBytes(path), Generation: gen, TraceContext: carrier})
	return traceID
}

// Deleted reports the removal of path and returns the event's trace ID.
func (w *fakeWatcher) Deleted(path string) string {
	carrier, traceID := eventTrace("watcher.deleted")
	w.mu.Lock()
	defer w.mu.Unlock()
	gen, ok := w.sockets[path]
	if !ok {
		return ""
	}
	delete(w.sockets, path)
	w.broadcastLocked(&watcherv1.SocketEvent{Type: watcherv1.SocketEventType_SOCKET_EVENT_TYPE_DELETED, Path: bounds.PathText(path), PathBytes: bounds.PathBytes(path), Generation: gen, TraceContext: carrier})
	return traceID
}

// Restart ends every stream (as a watcher process restart does) after
// applying change to the socket set without events.
func (w *fakeWatcher) Restart(change func(sockets map[string]string)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.stop)
	w.stop = make(chan struct{})
	w.instance = uuid.NewString()
	if change != nil {
		change(w.sockets)
	}
}

func (w *fakeWatcher) Streams() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.streams
}

// fakeDM is the devicemanager's API over an in-memory endpoint table, and
// its DRAService over a table of DRA driver instances (fakeDRA).
type fakeDM struct {
	devicemanagerv1.UnimplementedDeviceManagerServiceServer

	mu          sync.Mutex
	instance    string
	endpoints   map[string]dmEndpoint // by endpoint path
	registerErr error
	// held endpoints: their RegisterPlugin waits until its caller
	// cancels it, as the devicemanager waits for an endpoint file that
	// does not appear.
	held  map[string]bool
	calls []string
	// DRA driver instances by driver name and endpoint (draKey), the
	// DRAService calls, and the error RegisterDRADriver fails with.
	dra            map[string]draInstance
	draCalls       []string
	draRegisterErr error
	stop           chan struct{}
	changes        map[chan *devicemanagerv1.ResourceChange]struct{}
	// lists and draLists count the ListResources and ListDRADrivers
	// answered (the reconciler's looks for orphans).
	lists, draLists int
}

type dmEndpoint struct {
	resource, socketPath, generation string
}

func newFakeDM(t *testing.T, path string) *fakeDM {
	d := &fakeDM{instance: uuid.NewString(), endpoints: map[string]dmEndpoint{}, dra: map[string]draInstance{}, stop: make(chan struct{}), changes: map[chan *devicemanagerv1.ResourceChange]struct{}{}}
	serve(t, path, func(s *grpc.Server) {
		devicemanagerv1.RegisterDeviceManagerServiceServer(s, d)
		devicemanagerv1.RegisterDRAServiceServer(s, &fakeDRA{d: d})
	})
	t.Cleanup(func() { d.mu.Lock(); close(d.stop); d.stop = make(chan struct{}); d.mu.Unlock() })
	return d
}

func (d *fakeDM) RegisterPlugin(ctx context.Context, r *devicemanagerv1.RegisterPluginRequest) (*devicemanagerv1.RegisterPluginResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, "register "+r.GetEndpoint()+" "+r.GetGeneration())
	if d.held[r.GetEndpoint()] {
		d.mu.Unlock()
		<-ctx.Done()
		d.mu.Lock()
		how := "cancelled "
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			how = "timed out "
		}
		d.calls = append(d.calls, how+r.GetEndpoint()+" "+r.GetGeneration())
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	if d.registerErr != nil {
		return nil, d.registerErr
	}
	// DESIGN "Identity": one live endpoint serves one resource.
	if e, ok := d.endpoints[r.GetEndpoint()]; ok && e.resource != r.GetResourceName() {
		return nil, status.Errorf(codes.AlreadyExists, "endpoint %s is live under resource %s", r.GetEndpoint(), e.resource)
	}
	d.endpoints[r.GetEndpoint()] = dmEndpoint{resource: r.GetResourceName(), socketPath: r.GetSocketPath(), generation: r.GetGeneration()}
	return &devicemanagerv1.RegisterPluginResponse{InstanceId: d.instance}, nil
}

func (d *fakeDM) DeregisterPlugin(_ context.Context, r *devicemanagerv1.DeregisterPluginRequest) (*devicemanagerv1.DeregisterPluginResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, "deregister "+r.GetEndpoint()+" "+r.GetGeneration())
	e, ok := d.endpoints[r.GetEndpoint()]
	removed := ok && e.resource == r.GetResourceName() && (r.GetGeneration() == "" || r.GetGeneration() == e.generation)
	if removed {
		delete(d.endpoints, r.GetEndpoint())
	}
	return &devicemanagerv1.DeregisterPluginResponse{InstanceId: d.instance, Removed: removed}, nil
}

func (d *fakeDM) ListResources(context.Context, *devicemanagerv1.ListResourcesRequest) (*devicemanagerv1.ListResourcesResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lists++
	byName := map[string]*devicemanagerv1.Resource{}
	for ep, e := range d.endpoints {
		r := byName[e.resource]
		if r == nil {
			r = &devicemanagerv1.Resource{Name: e.resource}
			byName[e.resource] = r
		}
		r.Endpoints = append(r.Endpoints, &devicemanagerv1.Endpoint{Endpoint: ep, SocketPath: e.socketPath, Generation: e.generation,
			RegistrationPath: devicemanagerv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY, State: devicemanagerv1.EndpointState_ENDPOINT_STATE_LIVE})
	}
	resp := &devicemanagerv1.ListResourcesResponse{InstanceId: d.instance}
	for _, n := range slices.Sorted(maps.Keys(byName)) {
		resp.Resources = append(resp.Resources, byName[n])
	}
	return resp, nil
}

func (d *fakeDM) WatchResources(_ *devicemanagerv1.WatchResourcesRequest, srv grpc.ServerStreamingServer[devicemanagerv1.WatchResourcesResponse]) error {
	ch := make(chan *devicemanagerv1.ResourceChange, 1000)
	d.mu.Lock()
	id, stop := d.instance, d.stop
	d.changes[ch] = struct{}{}
	d.mu.Unlock()
	defer func() { d.mu.Lock(); delete(d.changes, ch); d.mu.Unlock() }()
	if err := srv.Send(&devicemanagerv1.WatchResourcesResponse{InstanceId: id, Item: &devicemanagerv1.WatchResourcesResponse_Synced{Synced: &devicemanagerv1.Synced{}}}); err != nil {
		return err
	}
	for {
		select {
		case c := <-ch:
			if err := srv.Send(&devicemanagerv1.WatchResourcesResponse{InstanceId: id, Item: &devicemanagerv1.WatchResourcesResponse_Change{Change: c}}); err != nil {
				return err
			}
		case <-stop:
			return fmt.Errorf("devicemanager restarting: %w", errdefs.ErrUnavailable)
		case <-srv.Context().Done():
			return srv.Context().Err()
		}
	}
}

// Watchers returns how many WatchResources streams are open.
func (d *fakeDM) Watchers() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.changes)
}

// SetEndpointState reports, on every WatchResources stream, the resource
// of the endpoint with the endpoint in state (as a devicemanager whose
// ListAndWatch stream to the plugin ended, or came back, does).
func (d *fakeDM) SetEndpointState(endpoint, generation string, state devicemanagerv1.EndpointState) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.endpoints[endpoint]
	ep := &devicemanagerv1.Endpoint{Endpoint: endpoint, SocketPath: e.socketPath, Generation: generation,
		RegistrationPath: devicemanagerv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY, State: state}
	if state == devicemanagerv1.EndpointState_ENDPOINT_STATE_STOPPED {
		ep.StoppedTime = timestamppb.Now()
	}
	c := &devicemanagerv1.ResourceChange{Type: devicemanagerv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_UPDATED,
		Resource: &devicemanagerv1.Resource{Name: e.resource, Endpoints: []*devicemanagerv1.Endpoint{ep}}}
	for ch := range d.changes {
		ch <- c
	}
}

// Restart forgets every endpoint and DRA driver instance and takes a new
// instance ID, as a devicemanager that lost its state would.
func (d *fakeDM) Restart() {
	d.mu.Lock()
	defer d.mu.Unlock()
	close(d.stop)
	d.stop = make(chan struct{})
	d.instance = uuid.NewString()
	d.endpoints = map[string]dmEndpoint{}
	d.dra = map[string]draInstance{}
}

// Hold makes RegisterPlugin of endpoint wait until it is cancelled.
func (d *fakeDM) Hold(endpoint string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.held == nil {
		d.held = map[string]bool{}
	}
	d.held[endpoint] = true
}

func (d *fakeDM) SetRegisterError(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.registerErr = err
}

func (d *fakeDM) Endpoints() map[string]dmEndpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.endpoints)
}

// Lists returns how many ListResources and ListDRADrivers were answered.
func (d *fakeDM) Lists() (resources, draDrivers int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lists, d.draLists
}

func (d *fakeDM) Calls() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.calls)
}

// fakeCSI serves csi.v1 Identity and Node for a test plugin's socket.
type fakeCSI struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedNodeServer
	name  string
	calls atomic.Int32
}

func (c *fakeCSI) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	c.calls.Add(1)
	return &csi.GetPluginInfoResponse{Name: c.name, VendorVersion: "1.2.3"}, nil
}

func (c *fakeCSI) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	c.calls.Add(1)
	return &csi.NodeGetInfoResponse{NodeId: "node-1", MaxVolumesPerNode: 16,
		AccessibleTopology: &csi.Topology{Segments: map[string]string{"topology.example.com/zone": "a"}}}, nil
}

// tempRoot returns a short temporary root with plugins_registry beneath it.
func tempRoot(t *testing.T) (root, plugins string) {
	t.Helper()
	root = testutil.TempDir(t)
	plugins = layout.PluginsRegistryDir(root)
	if err := os.MkdirAll(plugins, 0o750); err != nil {
		t.Fatal(err)
	}
	return root, plugins
}
