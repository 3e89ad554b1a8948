package handler

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	utilversion "k8s.io/apimachinery/pkg/util/version"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// CSITimeout bounds each call to a CSI driver.
const CSITimeout = 10 * time.Second

// CSI handles CSIPlugin registrations: the kubelet's version rule on
// Validate; on Register it asks the driver (csi.v1 Identity.GetPluginInfo and
// Node.NodeGetInfo on its endpoint) and records the answer.
type CSI struct {
	drivers *Drivers
	now     func() time.Time
}

var _ cache.Handler = (*CSI)(nil)

// NewCSI returns a CSI handler recording into drivers.
func NewCSI(drivers *Drivers) *CSI { return &CSI{drivers: drivers, now: time.Now} }

func csiLog(format string, args ...any) string {
	return "kubernetes.io/csi: " + fmt.Sprintf(format, args...)
}

// Validate picks the highest supported version (only 1.x is accepted) and
// refuses a driver when one with the same name, on another endpoint, is
// already registered with an equal or higher version, as the kubelet does.
func (h *CSI) Validate(_ context.Context, name, endpoint string, versions []string) error {
	v, err := highestCSIVersion("ValidatePlugin", name, versions)
	if err != nil {
		return err
	}
	for _, d := range h.drivers.CSI() {
		if d.Name != name || d.Endpoint == endpoint {
			continue
		}
		if old, err := utilversion.ParseGeneric(d.HighestVersion); err == nil && !old.LessThan(v) {
			return errors.New(csiLog("ValidatePlugin failed for CSI driver %q: another driver with the same name is already registered with a higher supported version: %q", name, d.HighestVersion))
		}
	}
	return nil
}

func highestCSIVersion(caller, name string, versions []string) (*utilversion.Version, error) {
	if len(versions) == 0 {
		return nil, errors.New(csiLog("%s for CSI driver %q failed. Plugin returned an empty list for supported versions", caller, name))
	}
	v, err := utilversion.HighestSupportedVersion(versions)
	if err != nil {
		return nil, errors.New(csiLog("%s for CSI driver %q failed. None of the versions specified %q are supported. err=%v", caller, name, versions, err))
	}
	return v, nil
}

// Register asks the driver for its identity and node information and
// records it.
func (h *CSI) Register(ctx context.Context, p cache.Plugin) error {
	v, err := highestCSIVersion("RegisterPlugin", p.Name, p.Versions)
	if err != nil {
		return err
	}
	conn, err := rpcutil.DialPlugin(p.Endpoint)
	if err != nil {
		return fmt.Errorf("CSI driver %q: connect to %s: %w", p.Name, p.Endpoint, err)
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, CSITimeout)
	defer cancel()
	pi, err := csi.NewIdentityClient(conn).GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
	if err != nil {
		return fmt.Errorf("CSI driver %q at %s: GetPluginInfo: %w", p.Name, p.Endpoint, errdefs.FromGRPC(err))
	}
	ni, err := csi.NewNodeClient(conn).NodeGetInfo(cctx, &csi.NodeGetInfoRequest{})
	if err != nil {
		return fmt.Errorf("CSI driver %q at %s: NodeGetInfo: %w", p.Name, p.Endpoint, errdefs.FromGRPC(err))
	}
	if ni.GetNodeId() == "" {
		return fmt.Errorf("CSI driver %q at %s: NodeGetInfo returned an empty node id: %w", p.Name, p.Endpoint, errdefs.ErrInvalidArgument)
	}
	if pi.GetName() != "" && pi.GetName() != p.Name {
		return fmt.Errorf("CSI driver at %s: GetPluginInfo names it %q, registration names it %q: %w", p.Endpoint, pi.GetName(), p.Name, errdefs.ErrInvalidArgument)
	}
	h.drivers.putCSI(CSIDriver{
		Name:               p.Name,
		Endpoint:           p.Endpoint,
		SocketPath:         p.SocketPath,
		Versions:           slices.Clone(p.Versions),
		HighestVersion:     v.String(),
		NodeID:             ni.GetNodeId(),
		AccessibleTopology: maps.Clone(ni.GetAccessibleTopology().GetSegments()),
		MaxVolumesPerNode:  ni.GetMaxVolumesPerNode(),
		VendorVersion:      pi.GetVendorVersion(),
		Registered:         h.now(),
	})
	return nil
}

// Deregister drops the record.
func (h *CSI) Deregister(_ context.Context, p cache.Plugin) error {
	h.drivers.deleteCSI(p.SocketPath)
	return nil
}
