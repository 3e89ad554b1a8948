package web

import (
	"cmp"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/state"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/podinfo"
)

// The Pods view: the node-local API's pods, each with its containers'
// states, its claims as the dramanager reports them (allocated devices,
// prepared or not), its device-plugin devices as the devicemanager's
// ListAllocations reports them for its UID, its age and its latest
// event; and one pod's page with its conditions and events besides.

type containerRow struct {
	Name, Kind, Image, State, Reason, Message string
	Since, Age                                string // when it started or ended
	ExitCode                                  int32
	Restarts                                  int32
	Ready, Terminated                         bool
}

type podClaimRow struct {
	// Class is the state's CSS class: State, or "none" for one that is
	// words (not made yet, not listed).
	Name, Claim, Template, State, Class, Reason, Href string
	Devices                                           []string // driver/pool/device
	Prepared                                          bool
}

type podDevicesRow struct {
	Container, Resource string
	Devices             []deviceCell
}

type podRow struct {
	// PhaseClass is Phase in lower case, its CSS class.
	ID, Namespace, Name, UID, Phase, PhaseClass, Href string
	Since, Age                                        string
	Containers                                        []containerRow
	Claims                                            []podClaimRow
	Devices                                           []podDevicesRow
	// LastEvent is the reason of the pod's latest event, LastWarning
	// whether it is a warning, LastMessage its message.
	LastEvent, LastMessage string
	LastWarning            bool
}

type conditionRow struct {
	Type, Status, Reason, Message, Since, Age string
}

type eventRow struct {
	Type, Reason, Message, Source, Since, Age, FirstSince, FirstAge string
	Count                                                           int32
	Warning                                                         bool
}

type podsView struct {
	Status statusView
	Off    bool
	Pods   []podRow
}

type podView struct {
	Status                    statusView
	Off, Found                bool
	Namespace, Name           string
	Pod                       podRow
	Node, Reason, Message, IP string
	Conditions                []conditionRow
	Events                    []eventRow
}

// podsStatusOf is the lines of the sources the Pods view joins: the
// node-local API, the dramanager (claims) and the devicemanager
// (device-plugin devices).
func podsStatusOf(snap state.Snapshot) statusView {
	var v statusView
	if !snap.PodsOff {
		v = append(v, serviceStatus{state.API, snap.Status[state.API]})
	}
	return append(v, serviceStatus{state.DRA, snap.Status[state.DRA]}, serviceStatus{state.DeviceManager, snap.Status[state.DeviceManager]})
}

// podJoin indexes what the pods' rows are joined with.
type podJoin struct {
	claims map[string]*dmv1.Claim        // by namespace/name
	allocs map[string][]*dmv1.Allocation // by pod UID
	cells  map[string]deviceCell         // by resource NUL device ID
	events map[string][]*corev1.Event    // by namespace/name of the pod, oldest first
}

func joinOf(snap state.Snapshot) podJoin {
	j := podJoin{claims: map[string]*dmv1.Claim{}, allocs: map[string][]*dmv1.Allocation{}, cells: map[string]deviceCell{}, events: map[string][]*corev1.Event{}}
	for _, c := range snap.Claims {
		j.claims[c.GetNamespace()+"/"+c.GetName()] = c
	}
	for _, a := range snap.Allocations {
		j.allocs[a.GetPodUid()] = append(j.allocs[a.GetPodUid()], a)
	}
	for _, r := range snap.Resources {
		for _, c := range deviceCells(r) {
			j.cells[r.GetName()+"\x00"+c.ID] = c
		}
	}
	for _, e := range snap.Events {
		k := e.InvolvedObject.Namespace + "/" + e.InvolvedObject.Name
		j.events[k] = append(j.events[k], e)
	}
	return j
}

// eventsOf are the events of p, oldest first.
func (j podJoin) eventsOf(p *corev1.Pod) []*corev1.Event {
	return slices.DeleteFunc(slices.Clone(j.events[p.Namespace+"/"+p.Name]), func(e *corev1.Event) bool { return !podinfo.EventOf(e, p) })
}

// podHref is the page of one pod.
func podHref(namespace, name string) string {
	return "/pods/" + url.PathEscape(namespace) + "/" + url.PathEscape(name)
}

func podsOf(snap state.Snapshot, now time.Time) podsView {
	v := podsView{Status: podsStatusOf(snap), Off: snap.PodsOff}
	j := joinOf(snap)
	for _, p := range snap.Pods {
		v.Pods = append(v.Pods, j.rowOf(p, now))
	}
	return v
}

func (j podJoin) rowOf(p *corev1.Pod, now time.Time) podRow {
	r := podRow{
		ID: domID("pod", p.Namespace+"/"+p.Name), Namespace: p.Namespace, Name: p.Name, UID: string(p.UID),
		Phase: cmp.Or(string(p.Status.Phase), "Unknown"), Href: podHref(p.Namespace, p.Name),
	}
	if p.DeletionTimestamp != nil {
		r.Phase = "Terminating"
	}
	r.PhaseClass = strings.ToLower(r.Phase)
	r.Since, r.Age = sinceTime(p.CreationTimestamp, now)
	initStatuses := p.Status.InitContainerStatuses
	for _, c := range p.Spec.InitContainers {
		kind := "init"
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			kind = "sidecar"
		}
		r.Containers = append(r.Containers, containerOf(c, kind, initStatuses, now))
	}
	for _, c := range p.Spec.Containers {
		r.Containers = append(r.Containers, containerOf(c, "", p.Status.ContainerStatuses, now))
	}
	for _, ref := range podinfo.ClaimRefs(p) {
		r.Claims = append(r.Claims, j.claimOf(p.Namespace, ref))
	}
	for _, a := range j.allocs[string(p.UID)] {
		d := podDevicesRow{Container: a.GetContainerName(), Resource: a.GetResourceName()}
		for _, id := range a.GetDeviceIds() {
			c, ok := j.cells[a.GetResourceName()+"\x00"+id]
			if !ok {
				c = deviceCell{Resource: a.GetResourceName(), ID: id, State: "allocated", Label: "allocated"}
			}
			d.Devices = append(d.Devices, c)
		}
		r.Devices = append(r.Devices, d)
	}
	if evs := j.eventsOf(p); len(evs) > 0 {
		last := evs[len(evs)-1]
		r.LastEvent, r.LastMessage, r.LastWarning = last.Reason, last.Message, last.Type == corev1.EventTypeWarning
	}
	return r
}

// containerOf is a container of the pod with its status (among statuses,
// by name): its state, why it waits or ended, its exit code, its restarts.
func containerOf(c corev1.Container, kind string, statuses []corev1.ContainerStatus, now time.Time) containerRow {
	r := containerRow{Name: c.Name, Kind: kind, Image: c.Image, State: "unknown", Reason: "no status yet"}
	i := slices.IndexFunc(statuses, func(s corev1.ContainerStatus) bool { return s.Name == c.Name })
	if i < 0 {
		return r
	}
	st := statuses[i]
	r.Ready, r.Restarts, r.Reason = st.Ready, st.RestartCount, ""
	switch s := st.State; {
	case s.Waiting != nil:
		r.State, r.Reason, r.Message = "waiting", s.Waiting.Reason, s.Waiting.Message
	case s.Running != nil:
		r.State = "running"
		r.Since, r.Age = sinceTime(s.Running.StartedAt, now)
	case s.Terminated != nil:
		r.State, r.Terminated = "terminated", true
		r.Reason, r.Message, r.ExitCode = s.Terminated.Reason, s.Terminated.Message, s.Terminated.ExitCode
		r.Since, r.Age = sinceTime(s.Terminated.FinishedAt, now)
	}
	return r
}

// claimOf is one of a pod's claims with what the dramanager's ListClaims
// says of its ResourceClaim: its state (prepared or not) and devices.
func (j podJoin) claimOf(namespace string, ref podinfo.ClaimRef) podClaimRow {
	r := podClaimRow{Name: ref.Name, Claim: ref.Claim, Template: ref.Template, Class: "none"}
	if ref.Claim == "" {
		r.State = "not made yet"
		return r
	}
	c := j.claims[namespace+"/"+ref.Claim]
	if c == nil {
		r.State = "not listed"
		return r
	}
	r.State = strings.ToLower(strings.TrimPrefix(c.GetState().String(), "CLAIM_STATE_"))
	r.Class = r.State
	r.Prepared, r.Reason = c.GetState() == dmv1.ClaimState_CLAIM_STATE_PREPARED, c.GetReason()
	r.Href = "/dra#" + domID("claim", namespace+"/"+ref.Claim)
	for _, d := range c.GetDevices() {
		r.Devices = append(r.Devices, d.GetDriver()+"/"+d.GetPool()+"/"+d.GetDevice())
	}
	return r
}

// podOf is the page of the pod namespace/name.
func podOf(snap state.Snapshot, namespace, name string, now time.Time) podView {
	v := podView{Status: podsStatusOf(snap), Off: snap.PodsOff, Namespace: namespace, Name: name}
	i := slices.IndexFunc(snap.Pods, func(p *corev1.Pod) bool { return p.Namespace == namespace && p.Name == name })
	if i < 0 {
		return v
	}
	p := snap.Pods[i]
	j := joinOf(snap)
	v.Found, v.Pod = true, j.rowOf(p, now)
	v.Node, v.Reason, v.Message, v.IP = p.Spec.NodeName, p.Status.Reason, p.Status.Message, p.Status.PodIP
	for _, c := range p.Status.Conditions {
		cr := conditionRow{Type: string(c.Type), Status: string(c.Status), Reason: c.Reason, Message: c.Message}
		cr.Since, cr.Age = sinceTime(c.LastTransitionTime, now)
		v.Conditions = append(v.Conditions, cr)
	}
	evs := j.eventsOf(p)
	for k := len(evs) - 1; k >= 0; k-- { // newest first
		e := evs[k]
		er := eventRow{Type: e.Type, Reason: e.Reason, Message: e.Message, Count: podinfo.EventCount(e), Warning: e.Type == corev1.EventTypeWarning}
		er.Source = cmp.Or(e.ReportingController, e.Source.Component)
		er.Since, er.Age = sinceTime(metav1.NewTime(podinfo.EventLast(e)), now)
		if er.Count > 1 {
			er.FirstSince, er.FirstAge = sinceTime(metav1.NewTime(podinfo.EventFirst(e)), now)
		}
		v.Events = append(v.Events, er)
	}
	return v
}

// sinceTime is since for an API time.
func sinceTime(t metav1.Time, now time.Time) (rfc3339, age string) {
	if t.IsZero() {
		return "", ""
	}
	return t.UTC().Format(time.RFC3339Nano), fmtAge(now.Sub(t.Time))
}

// splitPodID reads a pod page's id, NAMESPACE/NAME.
func splitPodID(id string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(id, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%s is not NAMESPACE/NAME", quote(id))
	}
	return namespace, name, nil
}
