// Package handler holds the reconciler's plugin handlers, one per plugin
// type: DevicePlugin (relayed to the devicemanager), DRAPlugin (relayed to
// the devicemanager and recorded in a Drivers registry) and CSIPlugin
// (recorded in the Drivers registry). Each implements cache.Handler and the
// optional capabilities of package cache that apply to it.
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

// Driver is a registered CSI node plugin or DRA kubelet plugin.
type Driver struct {
	// Type is TypeCSIPlugin or TypeDRAPlugin.
	Type       string
	Name       string
	Endpoint   string
	SocketPath string
	Generation string
	Versions   []string
	Registered time.Time
	// CSI is what a CSI driver's NodeGetInfo said; nil for a DRA driver.
	CSI *CSINode
}

// CSINode is a CSI driver's node information, as the kubelet records it.
type CSINode struct {
	HighestVersion     string
	NodeID             string
	AccessibleTopology map[string]string
	MaxVolumesPerNode  int64
	// VendorVersion is empty: the kubelet, and nodeplug with it, calls no
	// GetPluginInfo.
	VendorVersion string
}

// Drivers holds the CSI and DRA driver records, keyed by registration
// socket path, and indexed by type and name: a registration checks the
// other records of its driver (Named) without walking every record, which
// a burst of N registrations would do N times. They live in memory only:
// after a restart the reconciler rebuilds them by registering the plugins
// again. Safe for concurrent use.
type Drivers struct {
	mu      sync.RWMutex
	drivers map[string]Driver
	byName  map[driverName]map[string]struct{} // socket paths
}

// driverName is the key of Drivers' index: a type and a driver name.
type driverName struct{ typ, name string }

// NewDrivers returns an empty registry.
func NewDrivers() *Drivers {
	return &Drivers{drivers: map[string]Driver{}, byName: map[driverName]map[string]struct{}{}}
}

// List returns the drivers of type typ sorted by name, then socket path.
func (d *Drivers) List(typ string) []Driver {
	d.mu.RLock()
	defer d.mu.RUnlock()
	var out []Driver
	for r := range maps.Values(d.drivers) {
		if r.Type == typ {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Driver) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.SocketPath, b.SocketPath))
	})
	return out
}

// Named returns the records of type typ and driver name, sorted by
// socket path.
func (d *Drivers) Named(typ, name string) []Driver {
	d.mu.RLock()
	defer d.mu.RUnlock()
	paths := d.byName[driverName{typ, name}]
	out := make([]Driver, 0, len(paths))
	for p := range paths {
		out = append(out, d.drivers[p])
	}
	slices.SortFunc(out, func(a, b Driver) int { return cmp.Compare(a.SocketPath, b.SocketPath) })
	return out
}

// put records r in place of any record of its socket path.
func (d *Drivers) put(r Driver) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if old, ok := d.drivers[r.SocketPath]; ok {
		d.unindexLocked(old)
	}
	d.drivers[r.SocketPath] = r
	k := driverName{r.Type, r.Name}
	if d.byName[k] == nil {
		d.byName[k] = map[string]struct{}{}
	}
	d.byName[k][r.SocketPath] = struct{}{}
}

// unindexLocked removes r from the index by name.
func (d *Drivers) unindexLocked(r Driver) {
	k := driverName{r.Type, r.Name}
	delete(d.byName[k], r.SocketPath)
	if len(d.byName[k]) == 0 {
		delete(d.byName, k)
	}
}

// remove drops the record of socketPath when it is of type typ and
// generation: a newer generation, or a plugin of another type, registered
// at the same socket meanwhile, stays.
func (d *Drivers) remove(typ, socketPath, generation string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r, ok := d.drivers[socketPath]; ok && r.Type == typ && r.Generation == generation {
		d.unindexLocked(r)
		delete(d.drivers, socketPath)
	}
}
