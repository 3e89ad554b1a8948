package handler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// draServices are the gRPC services a DRA plugin may offer, newest first
// (the kubelet's list).
var draServices = []string{"v1.DRAPlugin", "v1beta1.DRAPlugin"}

// DRA handles DRAPlugin registrations: it validates them as the kubelet
// does and records the driver. Nothing calls NodePrepareResources yet.
type DRA struct {
	drivers *Drivers
	now     func() time.Time
}

var _ cache.Handler = (*DRA)(nil)

// NewDRA returns a DRA handler recording into drivers.
func NewDRA(drivers *Drivers) *DRA { return &DRA{drivers: drivers, now: time.Now} }

// Validate checks that the driver offers a DRA gRPC service the kubelet
// supports; supported versions are gRPC service names.
func (h *DRA) Validate(_ context.Context, name, endpoint string, versions []string) error {
	if name == "" {
		return fmt.Errorf("DRA driver plugin at endpoint %s has an empty driver name", endpoint)
	}
	if _, err := chooseDRAService(versions); err != nil {
		return fmt.Errorf("invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: %w", name, endpoint, err)
	}
	return nil
}

func chooseDRAService(services []string) (string, error) {
	if len(services) == 0 {
		return "", errors.New("empty list of supported gRPC services (aka supported versions)")
	}
	for _, s := range services {
		if slices.Contains(draServices, s) {
			return s, nil
		}
	}
	return "", fmt.Errorf("none of services supported by the plugin (%q) are supported by the kubelet (%q)", services, draServices)
}

// Register records the driver.
func (h *DRA) Register(_ context.Context, p cache.Plugin) error {
	h.drivers.putDRA(DRADriver{
		Name:       p.Name,
		Endpoint:   p.Endpoint,
		SocketPath: p.SocketPath,
		Versions:   slices.Clone(p.Versions),
		Registered: h.now(),
	})
	return nil
}

// Deregister drops the record.
func (h *DRA) Deregister(_ context.Context, p cache.Plugin) error {
	h.drivers.deleteDRA(p.SocketPath)
	return nil
}
