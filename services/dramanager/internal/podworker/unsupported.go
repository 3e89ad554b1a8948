package podworker

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// unsupported lists the fields of a pod that nodeplug does not act on,
// each with why: the pod runs without them, and its user is told so by a
// warning Event rather than by silence. pod's limits are those left to
// the device plugins (not a DRA extended resource's).
func unsupported(pod *corev1.Pod, devicePlugins bool) []string {
	var out []string
	for i := range pod.Spec.Volumes {
		out = append(out, fmt.Sprintf("spec.volumes[%d] (%s): volumes are not mounted; devices reach a container only through CDI", i, pod.Spec.Volumes[i].Name))
	}
	check := func(path string, cs []corev1.Container) {
		for i, c := range cs {
			p := fmt.Sprintf("%s[%d]", path, i)
			for _, probe := range []struct {
				name string
				set  bool
			}{{"livenessProbe", c.LivenessProbe != nil}, {"readinessProbe", c.ReadinessProbe != nil}, {"startupProbe", c.StartupProbe != nil}, {"lifecycle", c.Lifecycle != nil}} {
				if probe.set {
					out = append(out, fmt.Sprintf("%s.%s: probes and lifecycle hooks are not run", p, probe.name))
				}
			}
			for j := range c.VolumeMounts {
				out = append(out, fmt.Sprintf("%s.volumeMounts[%d]: volumes are not mounted", p, j))
			}
			for j, port := range c.Ports {
				if port.HostPort != 0 {
					out = append(out, fmt.Sprintf("%s.ports[%d].hostPort: host ports are not opened", p, j))
				}
			}
			for _, name := range slices.Sorted(maps.Keys(c.Resources.Limits)) {
				if !devicePlugins && !native(name) {
					out = append(out, fmt.Sprintf("%s.resources.limits[%s]: no DeviceClass stands for it and the dramanager has no devicemanager to allocate device-plugin resources", p, name))
				}
			}
		}
	}
	check("spec.initContainers", pod.Spec.InitContainers)
	check("spec.containers", pod.Spec.Containers)
	return out
}

// native says whether a resource is one the node itself provides (CPU,
// memory, storage, huge pages), not a device plugin's or DRA's.
func native(name corev1.ResourceName) bool {
	switch name {
	case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage, corev1.ResourceStorage:
		return true
	}
	return strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix)
}

// warnUnsupported records one warning Event listing what the pod asks for
// that nodeplug does not do, once per pod.
func (w *Worker) warnUnsupported(pod *corev1.Pod) {
	w.mu.Lock()
	told := w.warned[pod.UID]
	w.warned[pod.UID] = true
	w.mu.Unlock()
	if told {
		return
	}
	if fields := unsupported(pod, w.cfg.Devices != nil); len(fields) > 0 {
		w.recorder.Event(pod, corev1.EventTypeWarning, ReasonUnsupportedField, message("not done by nodeplug: "+strings.Join(fields, "; ")))
	}
}
