package claims

import (
	"cmp"
	"slices"

	"github.com/nodeplug/nodeplug/services/internal/store"
)

// PodClaims are the claims a pod's containers use, as prepared: per
// container the devices of the claims and requests it references.
type PodClaims struct {
	Pod        PodRef
	Containers []ContainerResult // by container name
}

// Pods returns every pod that uses a prepared claim, by namespace, name
// and UID (what the pod resources API lists as dynamic resources), or,
// when podUID is not empty, only that pod (a container start's).
func (m *Manager) Pods(podUID string) []PodClaims {
	byUID := map[string]*PodClaims{}
	m.mu.Lock()
	for _, r := range m.records {
		if r.rec.State != store.ClaimPrepared {
			continue
		}
		ref := ClaimRef{Namespace: r.rec.Namespace, Name: r.rec.Name, UID: r.rec.UID}
		var devs []Device // read once per claim, and only for a pod asked for
		for _, p := range r.rec.Pods {
			if podUID != "" && p.UID != podUID {
				continue
			}
			if devs == nil {
				devs = devicesOf(r.rec.Devices)
			}
			pc := byUID[p.UID]
			if pc == nil {
				pc = &PodClaims{Pod: PodRef{UID: p.UID, Namespace: p.Namespace, Name: p.Name}}
				byUID[p.UID] = pc
			}
			for _, u := range p.Containers {
				i := slices.IndexFunc(pc.Containers, func(c ContainerResult) bool { return c.Container == u.Container })
				if i < 0 {
					pc.Containers = append(pc.Containers, ContainerResult{Container: u.Container, CDIDeviceIDs: []string{}, Devices: []ClaimDevice{}})
					i = len(pc.Containers) - 1
				}
				addDevices(&pc.Containers[i], ref, devs, u.Request)
			}
		}
	}
	m.mu.Unlock()
	out := make([]PodClaims, 0, len(byUID))
	for _, pc := range byUID {
		slices.SortFunc(pc.Containers, func(a, b ContainerResult) int { return cmp.Compare(a.Container, b.Container) })
		for i := range pc.Containers {
			slices.SortStableFunc(pc.Containers[i].Devices, func(a, b ClaimDevice) int {
				return cmp.Or(cmp.Compare(a.Claim.Namespace, b.Claim.Namespace), cmp.Compare(a.Claim.Name, b.Claim.Name))
			})
		}
		out = append(out, *pc)
	}
	slices.SortFunc(out, func(a, b PodClaims) int {
		return cmp.Or(cmp.Compare(a.Pod.Namespace, b.Pod.Namespace), cmp.Compare(a.Pod.Name, b.Pod.Name), cmp.Compare(a.Pod.UID, b.Pod.UID))
	})
	return out
}

// Container returns what one container of a pod gets of the claims
// prepared for the pod (as Pods lists it): the CDI device IDs of the
// claims and requests it references, without duplicates, and those
// devices. ok is false when the container references no prepared claim.
func (m *Manager) Container(podUID, container string) (res ContainerResult, ok bool) {
	for _, pc := range m.Pods(podUID) {
		for _, c := range pc.Containers {
			if c.Container == container {
				return c, true
			}
		}
	}
	return ContainerResult{}, false
}
