package handler

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

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
	if _, err := kubeletrules.ChooseDRAService(versions); err != nil {
		return fmt.Errorf("invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: %w", name, endpoint, err)
	}
	return nil
}

// Register records the driver.
func (h *DRA) Register(_ context.Context, p cache.Plugin) error {
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

// Deregister drops the record.
func (h *DRA) Deregister(_ context.Context, p cache.Plugin) error {
	h.drivers.remove(TypeDRAPlugin, p.SocketPath, p.Generation)
	return nil
}
