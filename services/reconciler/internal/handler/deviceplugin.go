package handler

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/status"

	devicemanagerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// DeviceManagerTimeout bounds each call to the devicemanager. RegisterPlugin
// returns only after the devicemanager dialled the plugin and called
// GetDevicePluginOptions, so it is generous.
const DeviceManagerTimeout = 30 * time.Second

// DevicePlugin handles DevicePlugin registrations by relaying them to the
// devicemanager (RegisterPlugin / DeregisterPlugin). It follows the
// devicemanager's instance ID, from every response and from WatchResources
// (see Run), and calls OnInstanceChange when it changes: a restarted
// devicemanager must hear about every registered plugin again.
type DevicePlugin struct {
	client devicemanagerv1.DeviceManagerServiceClient
	log    *slog.Logger

	mu         sync.Mutex
	instance   string
	onChange   func(old, new string)
	onEndpoint func(EndpointState)
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
func (h *DevicePlugin) OnEndpoint(f func(EndpointState)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onEndpoint = f
}

var (
	_ cache.Handler            = (*DevicePlugin)(nil)
	_ cache.OrphanDeregisterer = (*DevicePlugin)(nil)
)

// NewDevicePlugin returns a handler talking to the devicemanager through
// client. onChange (may be nil) is called, outside any lock, when the
// devicemanager's instance ID changes from one known value to another.
func NewDevicePlugin(client devicemanagerv1.DeviceManagerServiceClient, log *slog.Logger, onChange func(old, new string)) *DevicePlugin {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &DevicePlugin{client: client, log: log, onChange: onChange}
}

// Validate applies the kubelet's device plugin rules for plugins found in
// plugins_registry, with its messages (kubeletrules.ValidatePluginWatcher).
// An endpoint that is not valid UTF-8 (a registration socket with such a
// name whose GetInfo left the endpoint empty) is refused: the
// devicemanager's RegisterPlugin carries it in a proto string, and the
// devicemanager dials the endpoint it is given.
func (h *DevicePlugin) Validate(_ context.Context, name, endpoint string, versions []string) error {
	if !utf8.ValidString(endpoint) {
		return fmt.Errorf("device plugin endpoint %s is not valid UTF-8, which the devicemanager's API cannot carry; name a UTF-8 endpoint in GetInfo: %w",
			bounds.Quote(endpoint), errdefs.ErrInvalidArgument)
	}
	return kubeletrules.ValidatePluginWatcher(name, versions)
}

// Register calls the devicemanager's RegisterPlugin. Registering the same
// endpoint and generation again is a no-op downstream.
func (h *DevicePlugin) Register(ctx context.Context, p cache.Plugin) error {
	ctx, cancel := context.WithTimeout(ctx, DeviceManagerTimeout)
	defer cancel()
	resp, err := h.client.RegisterPlugin(ctx, &devicemanagerv1.RegisterPluginRequest{
		ResourceName: p.Name,
		Endpoint:     p.Endpoint,
		Versions:     p.Versions,
		// Quoted when not UTF-8 (bounds.PathText); ListResources and
		// WatchResources give it back so, and endpoints and
		// DeregisterOrphans decode it.
		SocketPath: bounds.PathText(p.SocketPath),
		Generation: p.Generation,
	})
	if err != nil {
		werr := fmt.Errorf("devicemanager RegisterPlugin for resource %s at %s: %w", p.Name, p.Endpoint, errdefs.FromGRPC(err))
		if msg, ok := kubeletMessage(err); ok {
			return &KubeletWorded{Message: msg, Err: werr}
		}
		return werr
	}
	h.Observe(resp.GetInstanceId())
	return nil
}

// What a devicemanager RegisterPlugin failure carries for the plugin: an
// ErrorInfo detail of this domain and reason, the kubelet's message in
// metadata KubeletMessageKey.
const (
	KubeletMessageDomain = "nodeplug.devicemanager.v1"
	KubeletMessageReason = "KUBELET_MESSAGE"
	KubeletMessageKey    = "message"
)

// kubeletMessage returns the kubelet's words for a RegisterPlugin failure,
// when the devicemanager's status carries them.
func kubeletMessage(err error) (string, bool) {
	st, ok := status.FromError(err)
	if !ok {
		return "", false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == KubeletMessageDomain && info.GetReason() == KubeletMessageReason {
			if msg, ok := info.GetMetadata()[KubeletMessageKey]; ok {
				return msg, true
			}
		}
	}
	return "", false
}

// KubeletWorded is a handler error with what the kubelet would say for it
// (the plugin is told "plugin registration failed with err: " and
// KubeletMessage); Error keeps nodeplug's detail.
type KubeletWorded struct {
	Message string
	Err     error
}

func (e *KubeletWorded) Error() string { return e.Err.Error() }

// Unwrap returns the detailed error.
func (e *KubeletWorded) Unwrap() error { return e.Err }

// KubeletMessage returns the kubelet's words.
func (e *KubeletWorded) KubeletMessage() string { return e.Message }

// Deregister calls the devicemanager's DeregisterPlugin for this
// generation, so a newer registration of the endpoint is left alone.
func (h *DevicePlugin) Deregister(ctx context.Context, p cache.Plugin) error {
	ctx, cancel := context.WithTimeout(ctx, DeviceManagerTimeout)
	defer cancel()
	resp, err := h.client.DeregisterPlugin(ctx, &devicemanagerv1.DeregisterPluginRequest{
		ResourceName: p.Name,
		Endpoint:     p.Endpoint,
		Generation:   p.Generation,
	})
	if err != nil {
		return fmt.Errorf("devicemanager DeregisterPlugin for resource %s at %s: %w", p.Name, p.Endpoint, errdefs.FromGRPC(err))
	}
	h.Observe(resp.GetInstanceId())
	return nil
}

// Instance returns the last devicemanager instance ID seen ("" before the
// first).
func (h *DevicePlugin) Instance() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.instance
}

// Observe records an instance ID seen from the devicemanager.
func (h *DevicePlugin) Observe(id string) {
	if id == "" {
		return
	}
	h.mu.Lock()
	old := h.instance
	h.instance = id
	h.mu.Unlock()
	if old != "" && old != id {
		h.log.Info("devicemanager restarted; registering device plugins again", "old_instance", old, "instance", id)
		if h.onChange != nil {
			h.onChange(old, id)
		}
	}
}

// Run follows the devicemanager's WatchResources stream until ctx ends,
// resubscribing with backoff, and observes the instance ID of every
// message, so a devicemanager restart is noticed even when no registration
// is in flight.
func (h *DevicePlugin) Run(ctx context.Context) error {
	// A restarted devicemanager is noticed within a quarter second: the
	// registrations it lost are made again from then on.
	stream.Resubscribe(ctx, 20*time.Millisecond, 250*time.Millisecond, h.watch, func(err error, delay time.Duration) {
		h.log.Debug("devicemanager watch ended; resubscribing", "error", err, "in", delay)
	})
	return nil
}

func (h *DevicePlugin) watch(ctx context.Context) (synced bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Only the endpoints and the instance ID matter here: no device IDs,
	// and no item for each Allocate and Release.
	st, err := h.client.WatchResources(ctx, &devicemanagerv1.WatchResourcesRequest{OmitDeviceIds: true, OmitAllocationChanges: true})
	if err != nil {
		return false, err
	}
	for {
		m, err := st.Recv()
		if err != nil {
			return synced, err
		}
		h.Observe(m.GetInstanceId())
		if m.GetSynced() != nil {
			synced = true
		}
		h.endpoints(m.GetChange().GetResource())
	}
}

// endpoints reports the state of r's plugins_registry endpoints.
func (h *DevicePlugin) endpoints(r *devicemanagerv1.Resource) {
	h.mu.Lock()
	f := h.onEndpoint
	h.mu.Unlock()
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

// DeregisterOrphans deregisters every endpoint the devicemanager got
// through plugins_registry whose registration socket and generation are not
// desired (no longer in the desired state): they were registered by an
// earlier reconciler, or before a failed deregistration, and their sockets
// vanished or were recreated meanwhile. Each is deregistered with its own
// generation, so a newer registration of the same endpoint stays. Legacy
// kubelet.sock endpoints are left alone. It returns the number of endpoints
// removed.
func (h *DevicePlugin) DeregisterOrphans(ctx context.Context, desired func(socketPath, generation string) bool) (int, error) {
	lctx, cancel := context.WithTimeout(ctx, DeviceManagerTimeout)
	defer cancel()
	resp, err := h.client.ListResources(lctx, &devicemanagerv1.ListResourcesRequest{})
	if err != nil {
		return 0, fmt.Errorf("devicemanager ListResources: %w", errdefs.FromGRPC(err))
	}
	h.Observe(resp.GetInstanceId())
	n := 0
	var firstErr error
	for _, r := range resp.GetResources() {
		for _, e := range r.GetEndpoints() {
			if e.GetRegistrationPath() != devicemanagerv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY || desired(socketPath(e.GetSocketPath()), e.GetGeneration()) {
				continue
			}
			resp, err := h.client.DeregisterPlugin(lctx, &devicemanagerv1.DeregisterPluginRequest{ResourceName: r.GetName(), Endpoint: e.GetEndpoint(), Generation: e.GetGeneration()})
			if err != nil {
				err = fmt.Errorf("devicemanager DeregisterPlugin for resource %s at %s: %w", r.GetName(), e.GetEndpoint(), errdefs.FromGRPC(err))
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			h.Observe(resp.GetInstanceId())
			if !resp.GetRemoved() {
				continue
			}
			h.log.Info("deregistered device plugin whose socket is gone", "resource", r.GetName(), "endpoint", e.GetEndpoint(), "socket_path", e.GetSocketPath(), "generation", e.GetGeneration())
			n++
		}
	}
	return n, firstErr
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
