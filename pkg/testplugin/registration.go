package testplugin

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

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
	Time       time.Time // when it arrived
}

// Registered matches a status that reports success.
func Registered(s Status) bool { return s.Registered }

// Rejected matches a status that reports failure.
func Rejected(s Status) bool { return !s.Registered }

// Registration is a plugin's pluginregistration.Registration service, the
// one a registrar (the kubelet, nodeplug's reconciler) calls: it answers
// GetInfo with its Info and records every NotifyRegistrationStatus, which
// can be waited for. GetInfo can be told to wait or fail, and
// NotifyRegistrationStatus to fail. It is the registration server of both
// Plugin and internal/sampleplugin's device plugin.
//
// All methods are safe for concurrent use.
type Registration struct {
	registerapi.UnimplementedRegistrationServer
	log *slog.Logger

	mu            sync.Mutex
	info          Info
	getInfoDelay  time.Duration
	getInfoErr    error
	notifyErr     error
	getInfoCalls  int
	statuses      []Status
	statusChanged chan struct{} // closed and replaced on every new status
}

var _ registerapi.RegistrationServer = (*Registration)(nil)

// NewRegistration returns a Registration whose GetInfo answers info. log,
// when not nil, gets a line for every status received.
func NewRegistration(info Info, log *slog.Logger) *Registration {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registration{log: log, info: info, statusChanged: make(chan struct{})}
}

// SetInfo changes what GetInfo returns.
func (r *Registration) SetInfo(info Info) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.info = info
}

// SetGetInfoDelay makes GetInfo wait d (or until the caller gives up) before
// answering.
func (r *Registration) SetGetInfoDelay(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.getInfoDelay = d
}

// SetGetInfoError makes GetInfo fail with err (nil to answer normally).
func (r *Registration) SetGetInfoError(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.getInfoErr = err
}

// SetNotifyError makes NotifyRegistrationStatus fail with err (nil to
// accept). A failed notification is still recorded.
func (r *Registration) SetNotifyError(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.notifyErr = err
}

// GetInfoCalls returns how many GetInfo calls arrived.
func (r *Registration) GetInfoCalls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.getInfoCalls
}

// Statuses returns every NotifyRegistrationStatus received, oldest first.
func (r *Registration) Statuses() []Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Status(nil), r.statuses...)
}

// WaitStatus waits until a status received so far or later matches match
// (any status when match is nil) and returns the first one that does.
func (r *Registration) WaitStatus(ctx context.Context, match func(Status) bool) (Status, error) {
	return r.WaitStatusAfter(ctx, 0, match)
}

// WaitStatusAfter is WaitStatus that ignores the first n statuses (use
// len(Statuses()) to wait for a new one).
func (r *Registration) WaitStatusAfter(ctx context.Context, n int, match func(Status) bool) (Status, error) {
	for {
		r.mu.Lock()
		for _, s := range r.statuses[min(n, len(r.statuses)):] {
			if match == nil || match(s) {
				r.mu.Unlock()
				return s, nil
			}
		}
		changed, name := r.statusChanged, r.info.Name
		r.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return Status{}, fmt.Errorf("plugin %s: waiting for a registration status: %w (got %v)", name, ctx.Err(), r.Statuses())
		}
	}
}

// GetInfo implements pluginregistration.Registration.
func (r *Registration) GetInfo(ctx context.Context, _ *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.mu.Lock()
	r.getInfoCalls++
	info, delay, err := r.info, r.getInfoDelay, r.getInfoErr
	r.mu.Unlock()
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

// NotifyRegistrationStatus implements pluginregistration.Registration.
func (r *Registration) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.mu.Lock()
	r.statuses = append(r.statuses, Status{Registered: s.GetPluginRegistered(), Error: s.GetError(), Time: time.Now()})
	close(r.statusChanged)
	r.statusChanged = make(chan struct{})
	name, err := r.info.Name, r.notifyErr
	r.mu.Unlock()
	if s.GetPluginRegistered() {
		r.log.Info("registered", "name", name)
	} else {
		r.log.Warn("registration failed", "name", name, "error", s.GetError())
	}
	if err != nil {
		return nil, err
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}
