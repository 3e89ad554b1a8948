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
package testplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Info is what GetInfo returns.
type Info struct {
	Type     string // registerapi.DevicePlugin, CSIPlugin, DRAPlugin or anything else
	Name     string
	Endpoint string // empty: the registrar uses the registration socket itself
	Versions []string
}

// Status is one NotifyRegistrationStatus the plugin received.
type Status struct {
	Registered bool
	Error      string
	Time       time.Time
}

// Options tune a Plugin at start.
type Options struct {
	// Register adds further services to the plugin's gRPC server before it
	// starts serving.
	Register func(s *grpc.Server)
}

// Plugin is a running registration server. Create it with Start.
type Plugin struct {
	path   string
	server *grpc.Server
	lis    net.Listener
	done   chan struct{}

	mu            sync.Mutex
	info          Info
	getInfoDelay  time.Duration
	getInfoErr    error
	notifyErr     error
	getInfoCalls  int
	statuses      []Status
	statusChanged chan struct{} // closed and replaced on every new status
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
		path:          path,
		server:        grpc.NewServer(),
		lis:           lis,
		done:          make(chan struct{}),
		info:          info,
		statusChanged: make(chan struct{}),
	}
	registerapi.RegisterRegistrationServer(p.server, &registration{p: p})
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

// SetInfo changes what GetInfo returns.
func (p *Plugin) SetInfo(info Info) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.info = info
}

// SetGetInfoDelay makes GetInfo wait d (or until the caller gives up) before
// answering.
func (p *Plugin) SetGetInfoDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.getInfoDelay = d
}

// SetGetInfoError makes GetInfo fail with err (nil to answer normally).
func (p *Plugin) SetGetInfoError(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.getInfoErr = err
}

// SetNotifyError makes NotifyRegistrationStatus fail with err (nil to
// accept). A failed notification is still recorded.
func (p *Plugin) SetNotifyError(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notifyErr = err
}

// GetInfoCalls returns how many GetInfo calls arrived.
func (p *Plugin) GetInfoCalls() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.getInfoCalls
}

// Statuses returns every NotifyRegistrationStatus received, oldest first.
func (p *Plugin) Statuses() []Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Status(nil), p.statuses...)
}

// Registered matches a status that reports success.
func Registered(s Status) bool { return s.Registered }

// Rejected matches a status that reports failure.
func Rejected(s Status) bool { return !s.Registered }

// WaitStatus waits until a status received since Start matches match (any
// status when match is nil) and returns the first one that does.
func (p *Plugin) WaitStatus(ctx context.Context, match func(Status) bool) (Status, error) {
	return p.WaitStatusAfter(ctx, 0, match)
}

// WaitStatusAfter is WaitStatus that ignores the first n statuses (use
// len(Statuses()) to wait for a new one).
func (p *Plugin) WaitStatusAfter(ctx context.Context, n int, match func(Status) bool) (Status, error) {
	for {
		p.mu.Lock()
		for _, s := range p.statuses[min(n, len(p.statuses)):] {
			if match == nil || match(s) {
				p.mu.Unlock()
				return s, nil
			}
		}
		changed := p.statusChanged
		p.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return Status{}, fmt.Errorf("testplugin %s: waiting for a registration status: %w (got %v)", p.path, ctx.Err(), p.Statuses())
		}
	}
}

type registration struct {
	registerapi.UnimplementedRegistrationServer
	p *Plugin
}

func (r *registration) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	p := r.p
	p.mu.Lock()
	p.getInfoCalls++
	info, delay, err := p.info, p.getInfoDelay, p.getInfoErr
	p.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err != nil {
		return nil, err
	}
	return &registerapi.PluginInfo{
		Type:              info.Type,
		Name:              info.Name,
		Endpoint:          info.Endpoint,
		SupportedVersions: append([]string(nil), info.Versions...),
	}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	p := r.p
	p.mu.Lock()
	defer p.mu.Unlock()
	p.statuses = append(p.statuses, Status{Registered: s.GetPluginRegistered(), Error: s.GetError(), Time: time.Now()})
	close(p.statusChanged)
	p.statusChanged = make(chan struct{})
	if p.notifyErr != nil {
		return nil, p.notifyErr
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
