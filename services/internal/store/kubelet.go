// This file is the kubelet's own device manager checkpoint format
// (k8s.io/kubernetes pkg/kubelet/cm/devicemanager/checkpoint, version 2),
// which the devicemanager keeps as a mirror of its state (mirror.go) and
// imports allocations from at a first start (migration from a kubelet).
//
// The file is the JSON encoding of checkpoint.Data, field names as keys:
//
//	{"Data":{"PodDeviceEntries":[{"PodUID":…,"ContainerName":…,"ResourceName":…,
//	  "DeviceIDs":{"<NUMA node>":[…]},"AllocResp":"<base64>"}],
//	  "RegisteredDevices":{"<resource>":[…]}},"Checksum":N}
//
// The checksum is the kubelet's (pkg/kubelet/checkpointmanager/checksum):
// FNV-32a over k8s.io/utils/dump.ForHash of the Data field, that is
// go-spew's "%#v" with sorted map keys. spew names the Go types of the
// kubelet's package in that text, so kubeletHashText writes the same text
// for the same values rather than formatting our own types.

package store

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// KubeletFileName is the kubelet's device manager checkpoint's name in the
// device-plugins directory (pkg/layout).
const KubeletFileName = layout.KubeletCheckpointFileName

// noTopology is the kubelet's NUMA node of a device with no topology
// (nodeWithoutTopology).
const noTopology = -1

// kubeletCheckpoint is the kubelet's checkpoint.Data: the same field names
// in the same order, so that encoding/json gives the kubelet's layout.
type kubeletCheckpoint struct {
	Data     kubeletData
	Checksum uint64
}

// kubeletData is the kubelet's checkpoint.checkpointData.
type kubeletData struct {
	PodDeviceEntries  []kubeletEntry
	RegisteredDevices map[string][]string
}

// kubeletEntry is the kubelet's checkpoint.PodDevicesEntry: one
// container's devices of one resource, by NUMA node, and the plugin's
// ContainerAllocateResponse in protobuf wire format.
type kubeletEntry struct {
	PodUID        string
	ContainerName string
	ResourceName  string
	DeviceIDs     map[int64][]string
	AllocResp     []byte
}

// kubeletChecksum is the kubelet's checksum of d.
func kubeletChecksum(d *kubeletData) uint64 {
	h := fnv.New32a()
	_, _ = h.Write(kubeletHashText(d))
	return uint64(h.Sum32())
}

// kubeletHashText is what the kubelet hashes for d: spew's "%#v" of a
// checkpoint.checkpointData holding the same values (type names in
// parentheses before each struct field's value, none inside slices and
// maps, map keys sorted, nil slices and maps as <nil>, strings unquoted).
func kubeletHashText(d *kubeletData) []byte {
	b := []byte("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)")
	if d.PodDeviceEntries == nil {
		b = append(b, "<nil>"...)
	} else {
		b = append(b, '[')
		for i := range d.PodDeviceEntries {
			if i > 0 {
				b = append(b, ' ')
			}
			b = appendHashEntry(b, &d.PodDeviceEntries[i])
		}
		b = append(b, ']')
	}
	b = append(b, " RegisteredDevices:(map[string][]string)"...)
	if d.RegisteredDevices == nil {
		b = append(b, "<nil>"...)
	} else {
		b = append(b, "map["...)
		for i, k := range slices.Sorted(maps.Keys(d.RegisteredDevices)) {
			if i > 0 {
				b = append(b, ' ')
			}
			b = append(b, k...)
			b = append(b, ':')
			b = appendHashStrings(b, d.RegisteredDevices[k])
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

func appendHashEntry(b []byte, e *kubeletEntry) []byte {
	b = append(b, "{PodUID:(string)"...)
	b = append(b, e.PodUID...)
	b = append(b, " ContainerName:(string)"...)
	b = append(b, e.ContainerName...)
	b = append(b, " ResourceName:(string)"...)
	b = append(b, e.ResourceName...)
	b = append(b, " DeviceIDs:(checkpoint.DevicesPerNUMA)"...)
	if e.DeviceIDs == nil {
		b = append(b, "<nil>"...)
	} else {
		b = append(b, "map["...)
		for i, node := range slices.Sorted(maps.Keys(e.DeviceIDs)) {
			if i > 0 {
				b = append(b, ' ')
			}
			b = strconv.AppendInt(b, node, 10)
			b = append(b, ':')
			b = appendHashStrings(b, e.DeviceIDs[node])
		}
		b = append(b, ']')
	}
	b = append(b, " AllocResp:([]uint8)"...)
	if e.AllocResp == nil {
		b = append(b, "<nil>"...)
	} else {
		b = append(b, '[')
		for i, c := range e.AllocResp {
			if i > 0 {
				b = append(b, ' ')
			}
			b = strconv.AppendUint(b, uint64(c), 10)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

func appendHashStrings(b []byte, ss []string) []byte {
	if ss == nil {
		return append(b, "<nil>"...)
	}
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, s...)
	}
	return append(b, ']')
}

// marshalKubelet encodes resources and allocations as the kubelet's
// checkpoint, as the kubelet's writeCheckpoint would: every resource with
// its healthy devices (an empty list when none is healthy), and every
// allocation with its devices under each NUMA node of the device (-1 for
// a device with no topology, or no longer listed) and the plugin's answer.
// It sorts allocations.
func marshalKubelet(resources []Resource, allocations []Allocation) ([]byte, error) {
	d := kubeletData{RegisteredDevices: make(map[string][]string, len(resources))}
	numa := make(map[string]map[string][]int64, len(resources))
	for i := range resources {
		r := &resources[i]
		healthy := []string{}
		var nodes map[string][]int64 // only devices with a topology
		for _, dev := range r.Devices {
			if dev.Healthy {
				healthy = append(healthy, dev.ID)
			}
			if len(dev.NUMANodes) > 0 {
				if nodes == nil {
					nodes = map[string][]int64{}
				}
				nodes[dev.ID] = dev.NUMANodes
			}
		}
		slices.Sort(healthy)
		d.RegisteredDevices[r.Name] = healthy
		numa[r.Name] = nodes
	}
	slices.SortFunc(allocations, func(a, b Allocation) int { return a.Key().compare(b.Key()) })
	for i := range allocations {
		a := &allocations[i]
		ids := make(map[int64][]string)
		for _, id := range a.DeviceIDs {
			nodes := numa[a.ResourceName][id]
			if len(nodes) == 0 {
				nodes = []int64{noTopology}
			}
			for _, n := range nodes {
				ids[n] = append(ids[n], id)
			}
		}
		resp := a.Response
		if resp == nil {
			resp = []byte{} // an empty answer, as the kubelet marshals it
		}
		d.PodDeviceEntries = append(d.PodDeviceEntries, kubeletEntry{
			PodUID: a.PodUID, ContainerName: a.ContainerName, ResourceName: a.ResourceName, DeviceIDs: ids, AllocResp: resp,
		})
	}
	return json.Marshal(&kubeletCheckpoint{Data: d, Checksum: kubeletChecksum(&d)})
}

// unmarshalKubelet decodes and verifies a kubelet checkpoint, as the
// kubelet's checkpoint manager reads it. Errors wrap ErrCorrupt.
func unmarshalKubelet(b []byte) (*kubeletData, error) {
	var cp kubeletCheckpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		return nil, fmt.Errorf("%w: not a kubelet device manager checkpoint (version 2): %v", ErrCorrupt, err)
	}
	if sum := kubeletChecksum(&cp.Data); sum != cp.Checksum {
		return nil, fmt.Errorf("%w: checksum %d, computed %d", ErrCorrupt, cp.Checksum, sum)
	}
	return &cp.Data, nil
}

// kubeletAllocations returns the allocations of a kubelet checkpoint as
// nodeplug's, allocated at now: the devices of every NUMA node, sorted and
// each once, and the plugin's answer. An entry that breaks nodeplug's
// bounds, holds no device, or holds an answer that is not a
// ContainerAllocateResponse (the kubelet drops those too) is left out and
// described in skipped; of two entries with the same key, the later one
// counts, as in the kubelet.
func kubeletAllocations(d *kubeletData, now time.Time) (out []Allocation, skipped []string) {
	byKey := map[AllocationKey]int{}
	for i, e := range d.PodDeviceEntries {
		var ids []string
		for _, node := range e.DeviceIDs {
			ids = append(ids, node...)
		}
		slices.Sort(ids)
		ids = slices.Compact(ids)
		if err := validKubeletEntry(&e, ids); err != nil {
			skipped = append(skipped, fmt.Sprintf("entry %d (pod %s, container %s, resource %s): %v",
				i, bounds.Quote(e.PodUID), bounds.Quote(e.ContainerName), bounds.Quote(e.ResourceName), err))
			continue
		}
		a := Allocation{PodUID: e.PodUID, ContainerName: e.ContainerName, ResourceName: e.ResourceName,
			DeviceIDs: ids, Response: e.AllocResp, Allocated: now}
		if j, ok := byKey[a.Key()]; ok {
			out[j] = a
			continue
		}
		byKey[a.Key()] = len(out)
		out = append(out, a)
	}
	return out, skipped
}

func validKubeletEntry(e *kubeletEntry, ids []string) error {
	if err := bounds.PodUID(e.PodUID); err != nil {
		return err
	}
	if err := bounds.ContainerName(e.ContainerName, false); err != nil {
		return err
	}
	if err := bounds.Name("resource name", e.ResourceName); err != nil {
		return err
	}
	if len(ids) == 0 {
		return fmt.Errorf("no devices")
	}
	if err := proto.Unmarshal(e.AllocResp, &pluginapi.ContainerAllocateResponse{}); err != nil {
		return fmt.Errorf("the plugin's answer (AllocResp) cannot be read: %v", err)
	}
	for _, id := range ids {
		if err := bounds.DeviceID(id); err != nil {
			return err
		}
	}
	return nil
}
