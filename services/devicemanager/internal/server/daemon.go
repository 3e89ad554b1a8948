package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/nodeplug/nodeplug/services/devicemanager/internal/manager"
)

// Options configure a Daemon.
type Options struct {
	// DevicePluginsDir is <root>/device-plugins: kubelet.sock and the
	// checkpoint live there.
	DevicePluginsDir string
	// AllowedDirs confine plugin endpoints (default: DevicePluginsDir).
	AllowedDirs []string
	GracePeriod time.Duration
	Log         *slog.Logger
	Registerer  prometheus.Registerer
}

// Daemon is a started devicemanager: the manager, its gRPC service and the
// kubelet.sock server.
type Daemon struct {
	Manager *manager.Manager
	Service *Service
	Legacy  *Legacy
	log     *slog.Logger
}

// Start runs the start-up sequence: refuse a kubelet.sock that answers,
// restore the checkpoint and redial its endpoints, remove the other sockets
// in the device-plugins directory, and listen on kubelet.sock. Register
// d.Service on a gRPC server and call d.Run.
func Start(ctx context.Context, o Options) (*Daemon, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if err := CheckKubeletSocket(o.DevicePluginsDir); err != nil {
		return nil, err
	}
	m, err := manager.New(manager.Config{
		DevicePluginsDir: o.DevicePluginsDir, AllowedDirs: o.AllowedDirs,
		GracePeriod: o.GracePeriod, Log: o.Log, Registerer: o.Registerer,
	})
	if err != nil {
		return nil, err
	}
	if err := m.Restore(ctx); err != nil {
		_ = m.Close()
		return nil, err
	}
	if err := Sweep(o.DevicePluginsDir, m.LiveEndpointPaths(), o.Log); err != nil {
		_ = m.Close()
		return nil, err
	}
	legacy, err := ListenKubeletSocket(m, o.DevicePluginsDir, o.Log)
	if err != nil {
		_ = m.Close()
		return nil, err
	}
	o.Log.Info("devicemanager ready", "kubelet_sock", legacy.Path(), "instance_id", m.InstanceID(), "grace_period", m.GracePeriod())
	return &Daemon{Manager: m, Service: NewService(m), Legacy: legacy, log: o.Log}, nil
}

// Run serves kubelet.sock and expires resources until ctx ends, then stops
// without deregistering or releasing anything and flushes the checkpoint.
func (d *Daemon) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(d.Legacy.Serve)
	g.Go(func() error { return d.Manager.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		d.Legacy.Stop()
		return nil
	})
	err := g.Wait()
	if cerr := d.Manager.Close(); cerr != nil {
		d.log.Error("flushing the checkpoint at shutdown", "error", cerr)
		if err == nil {
			err = cerr
		}
	}
	return err
}
