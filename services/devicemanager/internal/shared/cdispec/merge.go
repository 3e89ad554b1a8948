package cdispec

import (
	"fmt"
	"maps"
	"slices"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Merge merges the device plugins' Allocate answers for one container, in
// the order given (the caller gives them in resource name order), as the
// kubelet's device manager does for a container's run options: the first
// value of an environment variable, of a mount or device node at a
// container path, and of an annotation wins; a later answer that gives a
// different one is a conflict, returned as a message (the kubelet logs
// it). The plugins' CDI devices are not edits: the caller passes them on
// by name.
func Merge(resps []*pluginapi.ContainerAllocateResponse) (Edits, []string) {
	var e Edits
	var conflicts []string
	mounts := map[string]string{}
	devices := map[string]string{}
	for _, r := range resps {
		if r == nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(r.Envs)) {
			conflicts = mergeKey(&e.Envs, k, r.Envs[k], "environment variable", conflicts)
		}
		e.Mounts, conflicts = mergeByPath(e.Mounts, r.Mounts, mounts, "mount", conflicts, func(m *pluginapi.Mount) (string, string, Mount) {
			return m.ContainerPath, m.HostPath, Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: m.ReadOnly}
		})
		e.Devices, conflicts = mergeByPath(e.Devices, r.Devices, devices, "device node", conflicts, func(d *pluginapi.DeviceSpec) (string, string, DeviceNode) {
			return d.ContainerPath, d.HostPath, DeviceNode{ContainerPath: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions}
		})
		for _, k := range slices.Sorted(maps.Keys(r.Annotations)) {
			conflicts = mergeKey(&e.Annotations, k, r.Annotations[k], "annotation", conflicts)
		}
	}
	return e, conflicts
}

// mergeByPath appends to out the items whose container path is not in
// seen yet (host paths by container path); a later item at a seen path
// with another host path is a conflict.
func mergeByPath[P any, T any](out []T, items []*P, seen map[string]string, what string, conflicts []string, conv func(*P) (string, string, T)) ([]T, []string) {
	for _, it := range items {
		if it == nil {
			continue
		}
		path, host, v := conv(it)
		if prev, ok := seen[path]; ok {
			if prev != host {
				conflicts = append(conflicts, fmt.Sprintf("%s at %q from %q conflicts with the earlier one from %q", what, path, host, prev))
			}
			continue
		}
		seen[path] = host
		out = append(out, v)
	}
	return out, conflicts
}

// mergeKey sets (*m)[k] = v unless k is set; a different value already
// there is a conflict.
func mergeKey(m *map[string]string, k, v, what string, conflicts []string) []string {
	if *m == nil {
		*m = map[string]string{}
	}
	if old, ok := (*m)[k]; ok {
		if old != v {
			conflicts = append(conflicts, fmt.Sprintf("%s %s=%q conflicts with the earlier value %q", what, k, v, old))
		}
		return conflicts
	}
	(*m)[k] = v
	return conflicts
}

// CDIDevices returns the plugins' CDI device names, in the order given,
// without duplicates.
func CDIDevices(resps []*pluginapi.ContainerAllocateResponse) []string {
	var out []string
	seen := map[string]bool{}
	for _, r := range resps {
		for _, d := range r.GetCdiDevices() {
			if d == nil || seen[d.Name] {
				continue
			}
			seen[d.Name] = true
			out = append(out, d.Name)
		}
	}
	return out
}
