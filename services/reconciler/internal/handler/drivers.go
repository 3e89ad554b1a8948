// Package handler holds the reconciler's plugin handlers, one per plugin
// type: DevicePlugin (relayed to the devicemanager), CSIPlugin and DRAPlugin
// (recorded in a Drivers registry). Each implements cache.Handler.
package handler

import (
	"cmp"
	"maps"
	"slices"
	"sync"
	"time"
)

// Plugin types, as in k8s.io/kubelet/pkg/apis/pluginregistration/v1.
const (
	TypeDevicePlugin = "DevicePlugin"
	TypeCSIPlugin    = "CSIPlugin"
	TypeDRAPlugin    = "DRAPlugin"
)

// CSIDriver is a registered CSI node plugin.
type CSIDriver struct {
	Name               string
	Endpoint           string
	SocketPath         string
	Versions           []string
	HighestVersion     string
	NodeID             string
	AccessibleTopology map[string]string
	MaxVolumesPerNode  int64
	// VendorVersion is empty: the kubelet, and nodeplug with it, calls no
	// GetPluginInfo.
	VendorVersion string
	Registered    time.Time
}

// DRADriver is a registered DRA kubelet plugin.
type DRADriver struct {
	Name       string
	Endpoint   string
	SocketPath string
	Versions   []string
	Registered time.Time
}

// Drivers holds the CSI and DRA driver records, keyed by registration
// socket path. They live in memory only: after a restart the reconciler
// rebuilds them by registering the plugins again. Safe for concurrent use.
type Drivers struct {
	mu  sync.RWMutex
	csi map[string]CSIDriver
	dra map[string]DRADriver
}

// NewDrivers returns an empty registry.
func NewDrivers() *Drivers {
	return &Drivers{csi: map[string]CSIDriver{}, dra: map[string]DRADriver{}}
}

// CSI returns the CSI drivers sorted by name, then socket path.
func (d *Drivers) CSI() []CSIDriver {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := slices.Collect(maps.Values(d.csi))
	slices.SortFunc(out, func(a, b CSIDriver) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.SocketPath, b.SocketPath))
	})
	return out
}

// DRA returns the DRA drivers sorted by name, then socket path.
func (d *Drivers) DRA() []DRADriver {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := slices.Collect(maps.Values(d.dra))
	slices.SortFunc(out, func(a, b DRADriver) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.SocketPath, b.SocketPath))
	})
	return out
}

func (d *Drivers) putCSI(r CSIDriver) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.csi[r.SocketPath] = r
}

func (d *Drivers) deleteCSI(socketPath string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.csi, socketPath)
}

func (d *Drivers) putDRA(r DRADriver) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dra[r.SocketPath] = r
}

func (d *Drivers) deleteDRA(socketPath string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.dra, socketPath)
}
