package server

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"go.opentelemetry.io/otel/trace"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/manager"
)

// Registrar is what the legacy Registration service needs of the device
// manager. Register is safe for concurrent use.
type Registrar interface {
	Register(ctx context.Context, r manager.Registration) error
}

var _ Registrar = (*manager.Manager)(nil)

// Registration serves v1beta1.Registration/Register, on kubelet.sock.
type Registration struct {
	pluginapi.UnimplementedRegistrationServer
	m   Registrar
	dir string
	log *slog.Logger
}

var _ pluginapi.RegistrationServer = (*Registration)(nil)

// NewRegistration returns the legacy Registration service of m for plugins
// whose sockets live in dir, the device-plugins directory.
func NewRegistration(m Registrar, dir string, log *slog.Logger) *Registration {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registration{m: m, dir: dir, log: log}
}

// Register implements v1beta1.Registration: the endpoint is a file name in
// the device-plugins directory, joined to it at once. Each legacy
// registration starts its own trace.
func (r *Registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	ctx, span := tracer.Start(ctx, "legacy Register "+req.GetResourceName(), trace.WithNewRoot())
	defer span.End()
	ep := req.GetEndpoint()
	if ep == "" || strings.Contains(ep, "/") || ep == "." || ep == ".." {
		return nil, fmt.Errorf("endpoint %q must be a socket file name in %s: %w", ep, r.dir, errdefs.ErrInvalidArgument)
	}
	err := r.m.Register(ctx, manager.Registration{
		Resource: req.GetResourceName(), Endpoint: filepath.Join(r.dir, ep), Versions: []string{req.GetVersion()},
		Path: manager.PathKubeletSock,
	})
	if err != nil {
		r.log.WarnContext(ctx, "legacy Register failed", "resource", req.GetResourceName(), "endpoint", ep, "error", err)
		return nil, err
	}
	return &pluginapi.Empty{}, nil
}
