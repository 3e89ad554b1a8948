package handler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	devicemanagerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// DRA handles DRAPlugin registrations as the kubelet's DRA plugin manager
// (pkg/kubelet/cm/dra/plugin) does: Validate checks the gRPC services the
// driver offers; Register hands the driver instance to the devicemanager
// (DRAService.RegisterDRADriver), which dials it and keeps the connection,
// then records it in the driver registry for ListDrivers; Deregister
// removes both.
//
// Several instances of one driver may be registered at once (the upstream
// helper's rolling update: distinct registration sockets and endpoints,
// one driver name); as in the kubelet, each is its own registration, and
// only an endpoint that another instance of the driver already holds is
// refused. The dramanager keys instances by driver name and endpoint
// (EndpointKeyed) and keeps them beyond the reconciler's life
// (OrphanDeregisterer). Unlike a device plugin's, a driver's endpoint is
// not waited for (the kubelet does not wait for it either): one that does
// not exist yet is refused by the dramanager, which cannot dial it, and
// the reconciler retries it with its backoff, as it retries a CSI
// driver's.
type DRA struct {
	dm      *DeviceManager
	drivers *Drivers
	now     func() time.Time
}

var (
	_ cache.Handler            = (*DRA)(nil)
	_ cache.EndpointKeyed      = (*DRA)(nil)
	_ cache.OrphanDeregisterer = (*DRA)(nil)
	_ cache.DownstreamReady    = (*DRA)(nil)
)

// NewDRA returns a DRA handler recording into drivers and relaying to dm,
// the dramanager (NewDRAManager).
func NewDRA(drivers *Drivers, dm *DeviceManager) *DRA {
	return &DRA{dm: dm, drivers: drivers, now: time.Now}
}

// Validate checks that the driver offers a DRA gRPC service the kubelet
// supports; supported versions are gRPC service names.
func (h *DRA) Validate(_ context.Context, name, endpoint string, versions []string) error {
	if name == "" {
		return fmt.Errorf("DRA driver plugin at endpoint %s has an empty driver name", endpoint)
	}
	if _, err := kubeletrules.ChooseDRAService(versions); err != nil {
		return fmt.Errorf("invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: %w", name, endpoint, err)
	}
	return nil
}

// DownstreamReady reports whether the dramanager is reachable.
func (h *DRA) DownstreamReady() bool { return h.dm.Ready() }

// Replaces holds when p names old's driver and endpoint: the devicemanager
// then replaces old's instance with p's generation.
func (h *DRA) Replaces(old, p cache.Plugin) bool {
	return old.Name == p.Name && old.Endpoint == p.Endpoint
}

// Register refuses an endpoint that another registration socket's instance
// of the same driver holds, with the kubelet's words ("One plugin instance
// cannot hijack the endpoint of another instance"), then calls the
// devicemanager's RegisterDRADriver and records the instance. Registering
// the same driver, endpoint and generation again is a no-op downstream.
func (h *DRA) Register(ctx context.Context, p cache.Plugin) error {
	for _, d := range h.drivers.Named(TypeDRAPlugin, p.Name) {
		if d.Endpoint == p.Endpoint && d.SocketPath != p.SocketPath {
			msg := fmt.Sprintf("endpoint %s already registered for DRA driver plugin %s", p.Endpoint, p.Name)
			return kubeletrules.Wrap(msg, fmt.Errorf("%s through registration socket %s: %w", msg, bounds.Quote(d.SocketPath), errdefs.ErrAlreadyExists))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, DeviceManagerTimeout)
	defer cancel()
	resp, err := h.dm.dra.RegisterDRADriver(ctx, &devicemanagerv1.RegisterDRADriverRequest{
		DriverName: p.Name,
		// Paths that are not UTF-8 go quoted, with their bytes beside.
		Endpoint:        bounds.PathText(p.Endpoint),
		EndpointBytes:   bounds.PathBytes(p.Endpoint),
		Services:        p.Versions,
		SocketPath:      bounds.PathText(p.SocketPath),
		SocketPathBytes: bounds.PathBytes(p.SocketPath),
		Generation:      p.Generation,
	})
	if err != nil {
		werr := fmt.Errorf("dramanager RegisterDRADriver for DRA driver %s at %s: %w", p.Name, p.Endpoint, errdefs.FromGRPC(err))
		if msg, ok := kubeletrules.FromStatus(err); ok {
			return kubeletrules.Wrap(msg, werr)
		}
		return werr
	}
	h.dm.Observe(resp.GetInstanceId())
	h.drivers.put(Driver{
		Type:       TypeDRAPlugin,
		Name:       p.Name,
		Endpoint:   p.Endpoint,
		SocketPath: p.SocketPath,
		Generation: p.Generation,
		Versions:   slices.Clone(p.Versions),
		Registered: h.now(),
	})
	return nil
}

// Deregister drops the record, then calls the devicemanager's
// DeregisterDRADriver for this generation, so a newer registration of the
// endpoint is left alone. When that fails, the instance is an orphan that
// DeregisterOrphans removes later.
func (h *DRA) Deregister(ctx context.Context, p cache.Plugin) error {
	h.drivers.remove(TypeDRAPlugin, p.SocketPath, p.Generation)
	ctx, cancel := context.WithTimeout(ctx, DeviceManagerTimeout)
	defer cancel()
	resp, err := h.dm.dra.DeregisterDRADriver(ctx, &devicemanagerv1.DeregisterDRADriverRequest{
		DriverName:    p.Name,
		Endpoint:      bounds.PathText(p.Endpoint),
		EndpointBytes: bounds.PathBytes(p.Endpoint),
		Generation:    p.Generation,
	})
	if err != nil {
		return fmt.Errorf("dramanager DeregisterDRADriver for DRA driver %s at %s: %w", p.Name, p.Endpoint, errdefs.FromGRPC(err))
	}
	h.dm.Observe(resp.GetInstanceId())
	return nil
}

// DeregisterOrphans deregisters every DRA driver instance the devicemanager
// holds whose registration socket and generation are not desired: it was
// registered by an earlier reconciler, or before a failed deregistration,
// and its socket vanished or was recreated meanwhile. Each is deregistered
// with its own generation, so a newer registration of the same endpoint
// stays. It returns the number of instances removed.
func (h *DRA) DeregisterOrphans(ctx context.Context, desired func(socketPath, generation string) bool) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, DeviceManagerTimeout)
	defer cancel()
	resp, err := h.dm.dra.ListDRADrivers(ctx, &devicemanagerv1.ListDRADriversRequest{})
	if err != nil {
		return 0, fmt.Errorf("dramanager ListDRADrivers: %w", errdefs.FromGRPC(err))
	}
	h.dm.Observe(resp.GetInstanceId())
	n := 0
	var errs []error
	for _, d := range resp.GetDrivers() {
		for _, in := range d.GetInstances() {
			// A path that does not decode is kept as it came, so that it
			// matches no desired socket.
			sp, err := bounds.PathFromWire(in.GetSocketPath(), in.GetSocketPathBytes())
			if err != nil {
				sp = in.GetSocketPath()
			}
			if desired(sp, in.GetGeneration()) {
				continue
			}
			removed, err := h.deregisterOrphan(ctx, d.GetName(), in)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if removed {
				h.dm.log.Info("deregistered DRA driver instance whose socket is gone", "driver", d.GetName(), "endpoint", in.GetEndpoint(), "socket_path", in.GetSocketPath(), "generation", in.GetGeneration())
				n++
			}
		}
	}
	return n, errors.Join(errs...)
}

func (h *DRA) deregisterOrphan(ctx context.Context, driver string, in *devicemanagerv1.DRADriverInstance) (bool, error) {
	resp, err := h.dm.dra.DeregisterDRADriver(ctx, &devicemanagerv1.DeregisterDRADriverRequest{
		DriverName:    driver,
		Endpoint:      in.GetEndpoint(),
		EndpointBytes: in.GetEndpointBytes(),
		Generation:    in.GetGeneration(),
	})
	if err != nil {
		return false, fmt.Errorf("dramanager DeregisterDRADriver for DRA driver %s at %s: %w", driver, in.GetEndpoint(), errdefs.FromGRPC(err))
	}
	h.dm.Observe(resp.GetInstanceId())
	return resp.GetRemoved(), nil
}
