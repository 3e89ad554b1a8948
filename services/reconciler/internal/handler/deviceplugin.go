package handler

import (
	"context"
	"fmt"
	"time"
	"unicode/utf8"

	devicemanagerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// DevicePlugin handles DevicePlugin registrations by relaying them to the
// devicemanager (RegisterPlugin / DeregisterPlugin). The devicemanager
// keys its endpoints by endpoint and resource (EndpointKeyed) and keeps
// them beyond the reconciler's life (OrphanDeregisterer); an endpoint that
// does not exist yet is waited for, as the kubelet waits for it, by the
// reconciler, which holds no worker meanwhile (EndpointWaiter).
type DevicePlugin struct {
	dm *DeviceManager
}

var (
	_ cache.Handler            = (*DevicePlugin)(nil)
	_ cache.EndpointWaiter     = (*DevicePlugin)(nil)
	_ cache.EndpointKeyed      = (*DevicePlugin)(nil)
	_ cache.OrphanDeregisterer = (*DevicePlugin)(nil)
	_ cache.DownstreamReady    = (*DevicePlugin)(nil)
)

// NewDevicePlugin returns a handler relaying to dm.
func NewDevicePlugin(dm *DeviceManager) *DevicePlugin { return &DevicePlugin{dm: dm} }

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

// EndpointMissing is the kubelet's failure for a device plugin endpoint
// that did not appear within its dial timeout.
func (h *DevicePlugin) EndpointMissing(endpoint string, waited time.Duration) error {
	return kubeletrules.Wrap("failed to dial device plugin: "+context.DeadlineExceeded.Error(),
		fmt.Errorf("device plugin endpoint %s did not appear within %v: %w", endpoint, waited, errdefs.ErrUnavailable))
}

// DownstreamReady reports whether the devicemanager is reachable.
func (h *DevicePlugin) DownstreamReady() bool { return h.dm.Ready() }

// Replaces holds when p names old's resource and endpoint: the
// devicemanager then replaces old's endpoint with p's generation.
func (h *DevicePlugin) Replaces(old, p cache.Plugin) bool {
	return old.Name == p.Name && old.Endpoint == p.Endpoint
}

// Register calls the devicemanager's RegisterPlugin. Registering the same
// endpoint and generation again is a no-op downstream.
func (h *DevicePlugin) Register(ctx context.Context, p cache.Plugin) error {
	ctx, cancel := context.WithTimeout(ctx, DeviceManagerTimeout)
	defer cancel()
	resp, err := h.dm.client.RegisterPlugin(ctx, &devicemanagerv1.RegisterPluginRequest{
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
		if msg, ok := kubeletrules.FromStatus(err); ok {
			return kubeletrules.Wrap(msg, werr)
		}
		return werr
	}
	h.dm.Observe(resp.GetInstanceId())
	return nil
}

// Deregister calls the devicemanager's DeregisterPlugin for this
// generation, so a newer registration of the endpoint is left alone.
func (h *DevicePlugin) Deregister(ctx context.Context, p cache.Plugin) error {
	ctx, cancel := context.WithTimeout(ctx, DeviceManagerTimeout)
	defer cancel()
	resp, err := h.dm.client.DeregisterPlugin(ctx, &devicemanagerv1.DeregisterPluginRequest{
		ResourceName: p.Name,
		Endpoint:     p.Endpoint,
		Generation:   p.Generation,
	})
	if err != nil {
		return fmt.Errorf("devicemanager DeregisterPlugin for resource %s at %s: %w", p.Name, p.Endpoint, errdefs.FromGRPC(err))
	}
	h.dm.Observe(resp.GetInstanceId())
	return nil
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
	resp, err := h.dm.client.ListResources(lctx, &devicemanagerv1.ListResourcesRequest{})
	if err != nil {
		return 0, fmt.Errorf("devicemanager ListResources: %w", errdefs.FromGRPC(err))
	}
	h.dm.Observe(resp.GetInstanceId())
	n := 0
	var firstErr error
	for _, r := range resp.GetResources() {
		for _, e := range r.GetEndpoints() {
			if e.GetRegistrationPath() != devicemanagerv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY || desired(socketPath(e.GetSocketPath()), e.GetGeneration()) {
				continue
			}
			resp, err := h.dm.client.DeregisterPlugin(lctx, &devicemanagerv1.DeregisterPluginRequest{ResourceName: r.GetName(), Endpoint: e.GetEndpoint(), Generation: e.GetGeneration()})
			if err != nil {
				err = fmt.Errorf("devicemanager DeregisterPlugin for resource %s at %s: %w", r.GetName(), e.GetEndpoint(), errdefs.FromGRPC(err))
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			h.dm.Observe(resp.GetInstanceId())
			if !resp.GetRemoved() {
				continue
			}
			h.dm.log.Info("deregistered device plugin whose socket is gone", "resource", r.GetName(), "endpoint", e.GetEndpoint(), "socket_path", e.GetSocketPath(), "generation", e.GetGeneration())
			n++
		}
	}
	return n, firstErr
}
