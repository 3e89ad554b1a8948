package manager

import (
	"maps"
	"slices"
)

// DeviceInfo is one device of a resource as its plugin last reported it.
type DeviceInfo struct {
	ID      string
	Healthy bool
	// NUMANodes is the device's topology from the plugin (nil when the
	// plugin gave none, empty when it gave a topology without nodes).
	NUMANodes []int64
}

// ResourceDevices is the device set of one resource.
type ResourceDevices struct {
	Name    string
	Devices []DeviceInfo // sorted by ID
}

// ListDevices returns the device set of every resource, sorted by name,
// with each device's health and topology. A resource within its grace
// period lists its devices unhealthy. It is the read view the pod
// resources API answers from; the slices are the caller's.
func (c *core) ListDevices() []ResourceDevices {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]ResourceDevices, 0, len(c.resources))
	for _, name := range slices.Sorted(maps.Keys(c.resources)) {
		res := c.resources[name]
		rd := ResourceDevices{Name: name, Devices: make([]DeviceInfo, 0, len(res.devices))}
		for _, id := range res.sortedIDs() {
			d := res.devices[id]
			rd.Devices = append(rd.Devices, DeviceInfo{ID: id, Healthy: d.healthy, NUMANodes: slices.Clone(d.numa)})
		}
		out = append(out, rd)
	}
	return out
}
