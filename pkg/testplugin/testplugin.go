// Package testplugin is a plugin for tests and benchmarks that speaks the
// kubelet's plugin registration protocol (pluginregistration.Registration:
// GetInfo and NotifyRegistrationStatus) on a Unix socket. It is built on the
// upstream k8s.io/kubelet/pkg/apis/pluginregistration/v1 package, so a
// registrar that works with it works with real plugins.
//
// A Plugin answers GetInfo with a configurable PluginInfo, can be told to
// delay or fail GetInfo and to fail NotifyRegistrationStatus, and records
// every NotifyRegistrationStatus it receives:
//
//	p, err := testplugin.Start(path, testplugin.Info{Type: "DRAPlugin", Name: "dra.example.com",
//		Versions: []string{"v1.DRAPlugin"}})
//	defer p.Stop()
//	st, err := p.WaitStatus(ctx, testplugin.Registered)
//
// Other services can be served on the same socket through Options.Register
// (for example a CSI Identity and Node service, or a device plugin).
// All methods are safe for concurrent use.
//
// The registration service itself is Registration, which internal/sampleplugin
// serves too: one implementation of the plugin side of the protocol.
package testplugin

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Options tune a Plugin at start.
type Options struct {
	// Register adds further services to the plugin's gRPC server before it
	// starts serving.
	Register func(s *grpc.Server)
}

// Plugin is a running registration server: a Registration served on a Unix
// socket. Create it with Start.
type Plugin struct {
	*Registration
	path   string
	server *grpc.Server
	lis    net.Listener
	done   chan struct{}
}

// Start listens on path (removing a stale socket there first; the directory
// is created 0750) and serves the Registration service until Stop.
func Start(path string, info Info, opts ...Options) (*Plugin, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("testplugin: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("testplugin: remove stale socket %s: %w", path, err)
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("testplugin: listen on %s: %w", path, err)
	}
	return Serve(lis, path, info, opts...), nil
}

// Serve serves on lis, a listener the caller made for the socket at path
// (for example one that was bound well before it listened). Stop closes it
// and removes path.
func Serve(lis net.Listener, path string, info Info, opts ...Options) *Plugin {
	p := &Plugin{
		Registration: NewRegistration(info, nil),
		path:         path,
		server:       grpc.NewServer(),
		lis:          lis,
		done:         make(chan struct{}),
	}
	registerapi.RegisterRegistrationServer(p.server, p.Registration)
	for _, o := range opts {
		if o.Register != nil {
			o.Register(p.server)
		}
	}
	go func() {
		defer close(p.done)
		_ = p.server.Serve(lis)
	}()
	return p
}

// Path is the socket path.
func (p *Plugin) Path() string { return p.path }

// Stop stops serving and removes the socket. It is safe to call twice.
func (p *Plugin) Stop() {
	p.server.Stop()
	<-p.done
	_ = os.Remove(p.path)
}
