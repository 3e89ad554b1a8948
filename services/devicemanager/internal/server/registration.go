package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"go.opentelemetry.io/otel/trace"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
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
// the device-plugins directory, joined to it at once and dialled as exactly
// that path (a '#', '?' or "%xx" in the name is part of the name). Each
// legacy registration starts its own trace.
//
// Errors toward the plugin are the kubelet's: plain errors (gRPC code
// Unknown, as every error of the kubelet's Register) with the kubelet's
// words where it has any, else nodeplug's without its errdefs sentinel
// (kubeletrules.Told). nodeplug's own RegisterPlugin keeps its codes and
// detail.
func (r *Registration) Register(ctx context.Context, req *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	name := "legacy Register"
	if bounds.Name("resource name", req.GetResourceName()) == nil {
		name += " " + req.GetResourceName()
	}
	ctx, span := tracer.Start(ctx, name, trace.WithNewRoot())
	defer span.End()
	reg, err := legacyRegistration(r.dir, req)
	if err == nil {
		err = r.m.Register(ctx, reg)
	}
	if err != nil {
		r.log.WarnContext(ctx, "legacy Register failed", "resource", bounds.Quote(req.GetResourceName()), "endpoint", bounds.Quote(req.GetEndpoint()), "error", err)
		return nil, errors.New(kubeletrules.Told(err))
	}
	return &pluginapi.Empty{}, nil
}

// legacyRegistration is the registration a legacy Register asks for: its
// endpoint, a file name, joined to dir, the device-plugins directory.
func legacyRegistration(dir string, req *pluginapi.RegisterRequest) (manager.Registration, error) {
	ep := req.GetEndpoint()
	if ep == "" || strings.ContainsAny(ep, "/\x00") || ep == "." || ep == ".." {
		return manager.Registration{}, fmt.Errorf("endpoint %s must be a socket file name in %s: %w", bounds.Quote(ep), dir, errdefs.ErrInvalidArgument)
	}
	return manager.Registration{
		Resource: req.GetResourceName(), Endpoint: filepath.Join(dir, ep), Versions: []string{req.GetVersion()},
		Path: manager.PathKubeletSock,
	}, nil
}
