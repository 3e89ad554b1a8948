package handler

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	devicemanagerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/stream"
)

// DeviceManagerTimeout bounds each call to the devicemanager. RegisterPlugin
// returns only after the devicemanager dialled the plugin and called
// GetDevicePluginOptions, so it is generous.
const DeviceManagerTimeout = 30 * time.Second

// DeviceManager is the devicemanager as the handlers that relay to it (the
// DevicePlugin and DRA handlers) see it: its API and the instance ID it
// follows, from every response and from WatchResources (see Run). When the
// instance ID changes the devicemanager restarted and lost what it was
// told: onRestart is called so that every plugin of those handlers is
// registered with it again.
//
// The same type stands for nodeplug-dramanager, the DRA handler's peer
// (NewDRAManager): there the instance ID is the dramanager's, followed
// from WatchResourceSlices, and onRestart registers the DRA drivers again.
type DeviceManager struct {
	client devicemanagerv1.DeviceManagerServiceClient // nil for the dramanager
	dra    devicemanagerv1.DRAServiceClient           // nil for the devicemanager
	name   string                                     // "devicemanager" or "dramanager", for logs
	log    *slog.Logger
	// watch is the stream Run follows: WatchResources, or the
	// dramanager's WatchResourceSlices (watchSlices).
	watch func(ctx context.Context) (synced bool, err error)

	mu         sync.Mutex
	instance   string
	ready      bool // the watch stream is open
	onRestart  func(old, new string)
	onEndpoint func(EndpointState)
	onReady    func()
}

// NewDeviceManager returns the devicemanager reached through conn, which
// serves DeviceManagerService. onRestart (may be nil) is called, outside
// any lock, when the devicemanager's instance ID changes from one known
// value to another.
func NewDeviceManager(conn grpc.ClientConnInterface, log *slog.Logger, onRestart func(old, new string)) *DeviceManager {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &DeviceManager{
		client:    devicemanagerv1.NewDeviceManagerServiceClient(conn),
		name:      "devicemanager",
		log:       log,
		onRestart: onRestart,
	}
	m.watch = m.watchResources
	return m
}

// NewDRAManager returns nodeplug-dramanager reached through conn, which
// serves DRAService; onRestart is called as NewDeviceManager's when the
// dramanager's instance ID changes.
func NewDRAManager(conn grpc.ClientConnInterface, log *slog.Logger, onRestart func(old, new string)) *DeviceManager {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := &DeviceManager{
		dra:       devicemanagerv1.NewDRAServiceClient(conn),
		name:      "dramanager",
		log:       log,
		onRestart: onRestart,
	}
	m.watch = m.watchSlices
	return m
}

// EndpointState is what the devicemanager reports about one endpoint it got
// through plugins_registry.
type EndpointState struct {
	Resource, Endpoint, SocketPath, Generation string
	// Live: its ListAndWatch stream is open (or being opened). Stopped:
	// the stream ended, at StoppedTime.
	Live, Stopped bool
	StoppedTime   time.Time
}

// OnEndpoint sets f to be called, from Run, with the state of every
// plugins_registry endpoint in each resource change the devicemanager
// reports. Call it before Run.
func (m *DeviceManager) OnEndpoint(f func(EndpointState)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onEndpoint = f
}

// OnReady sets f to be called, from Run, each time the peer becomes
// reachable: its watch stream opened. f runs with m's lock held, so that
// once Ready reports true f has returned; it must not call m. Call it
// before Run.
func (m *DeviceManager) OnReady(f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.onReady = f
}

// Ready reports whether the peer is reachable: its watch stream is open.
func (m *DeviceManager) Ready() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ready
}

// setReady records whether the watch stream is open, and calls the
// OnReady function when it opens.
func (m *DeviceManager) setReady(ready bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	was := m.ready
	m.ready = ready
	if ready && !was && m.onReady != nil {
		m.onReady()
	}
}

// Instance returns the last devicemanager instance ID seen ("" before the
// first).
func (m *DeviceManager) Instance() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.instance
}

// Observe records an instance ID seen from the devicemanager.
func (m *DeviceManager) Observe(id string) {
	if id == "" {
		return
	}
	m.mu.Lock()
	old := m.instance
	m.instance = id
	m.mu.Unlock()
	if old != "" && old != id {
		m.log.Info(m.name+" restarted; registering its plugins again", "old_instance", old, "instance", id)
		if m.onRestart != nil {
			m.onRestart(old, id)
		}
	}
}

// Run follows the devicemanager's WatchResources stream (the
// dramanager's WatchResourceSlices) until ctx ends, resubscribing with
// backoff, and observes the instance ID of every message, so a restart is
// noticed even when no registration is in flight.
func (m *DeviceManager) Run(ctx context.Context) error {
	// A restart is noticed within a quarter second: the registrations it
	// lost are made again from then on.
	stream.Resubscribe(ctx, 20*time.Millisecond, 250*time.Millisecond, m.watch, func(err error, delay time.Duration) {
		m.log.Debug(m.name+" watch ended; resubscribing", "error", err, "in", delay)
	})
	return nil
}

// watchSlices follows the dramanager's WatchResourceSlices for its
// instance ID only.
func (m *DeviceManager) watchSlices(ctx context.Context) (synced bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := m.dra.WatchResourceSlices(ctx, &devicemanagerv1.WatchResourceSlicesRequest{})
	if err != nil {
		return false, err
	}
	defer m.setReady(false)
	for {
		msg, err := st.Recv()
		if err != nil {
			return synced, err
		}
		m.Observe(msg.GetInstanceId())
		m.setReady(true)
		if msg.GetSynced() != nil {
			synced = true
		}
	}
}

func (m *DeviceManager) watchResources(ctx context.Context) (synced bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Only the endpoints and the instance ID matter here: no device IDs,
	// and no item for each Allocate and Release.
	st, err := m.client.WatchResources(ctx, &devicemanagerv1.WatchResourcesRequest{OmitDeviceIds: true, OmitAllocationChanges: true})
	if err != nil {
		return false, err
	}
	defer m.setReady(false)
	for {
		msg, err := st.Recv()
		if err != nil {
			return synced, err
		}
		m.Observe(msg.GetInstanceId())
		m.setReady(true)
		if msg.GetSynced() != nil {
			synced = true
		}
		m.endpoints(msg.GetChange().GetResource())
	}
}

// endpoints reports the state of r's plugins_registry endpoints.
func (m *DeviceManager) endpoints(r *devicemanagerv1.Resource) {
	m.mu.Lock()
	f := m.onEndpoint
	m.mu.Unlock()
	if f == nil || r == nil {
		return
	}
	for _, e := range r.GetEndpoints() {
		if e.GetRegistrationPath() != devicemanagerv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY {
			continue
		}
		st := EndpointState{Resource: r.GetName(), Endpoint: e.GetEndpoint(), SocketPath: socketPath(e.GetSocketPath()), Generation: e.GetGeneration()}
		switch e.GetState() {
		case devicemanagerv1.EndpointState_ENDPOINT_STATE_LIVE, devicemanagerv1.EndpointState_ENDPOINT_STATE_CONNECTING:
			st.Live = true
		case devicemanagerv1.EndpointState_ENDPOINT_STATE_STOPPED:
			st.Stopped = true
			if t := e.GetStoppedTime(); t != nil {
				st.StoppedTime = t.AsTime()
			}
		}
		f(st)
	}
}

// socketPath is the registration socket path the devicemanager reports,
// as Register sent it (bounds.PathText) decoded; a text that does not decode
// is kept as it is, so it matches no desired socket.
func socketPath(text string) string {
	p, err := bounds.PathFromText(text)
	if err != nil {
		return text
	}
	return p
}
