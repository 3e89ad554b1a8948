// Package podinfo is what nodeplug's readers of the node-local API
// (nodeplugctl's pods, events and describe pod, and the console's Pods
// view) make of a Pod and its Events: the ResourceClaims its claims name,
// which events are its, and when an event occurred and how often.
package podinfo

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// ClaimRef is one of a pod's claims: its name in the pod, the
// ResourceClaim ("" while the one of a template is not made yet) and the
// template it is made from ("" for a claim the pod names itself).
type ClaimRef struct {
	Name, Claim, Template string
}

// ClaimRefs resolves the pod's claims, in the pod's order: a claim named
// as it is, a template's by the pod's status.resourceClaimStatuses; then
// the claim made for its DRA extended resources, when it has one.
func ClaimRefs(p *corev1.Pod) []ClaimRef {
	made := map[string]string{}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			made[s.Name] = *s.ResourceClaimName
		}
	}
	var out []ClaimRef
	for _, pc := range p.Spec.ResourceClaims {
		r := ClaimRef{Name: pc.Name}
		switch {
		case pc.ResourceClaimName != nil:
			r.Claim = *pc.ResourceClaimName
		case pc.ResourceClaimTemplateName != nil:
			r.Claim, r.Template = made[pc.Name], *pc.ResourceClaimTemplateName
		}
		out = append(out, r)
	}
	if x := p.Status.ExtendedResourceClaimStatus; x != nil {
		out = append(out, ClaimRef{Name: ExtendedClaimName(p), Claim: x.ResourceClaimName})
	}
	return out
}

// ExtendedClaim is the name under which a pod's claim for its DRA
// extended resources (status.extendedResourceClaimStatus) is shown and
// prepared beside the claims of its spec.
const ExtendedClaim = "extended-resources"

// ExtendedClaimName is the name of the pod's extended-resource claim
// among its claims: ExtendedClaim, or ExtendedClaim-<n> when a claim of
// its spec has that name.
func ExtendedClaimName(p *corev1.Pod) string {
	taken := func(n string) bool {
		return slices.ContainsFunc(p.Spec.ResourceClaims, func(pc corev1.PodResourceClaim) bool { return pc.Name == n })
	}
	name := ExtendedClaim
	for i := 2; taken(name); i++ {
		name = ExtendedClaim + "-" + strconv.Itoa(i)
	}
	return name
}

// EventOf says whether e, which names p's namespace and name, is about
// p: an event naming a UID names the pod of that UID (not an earlier pod
// of the same name).
func EventOf(e *corev1.Event, p *corev1.Pod) bool {
	return e.InvolvedObject.UID == "" || e.InvolvedObject.UID == p.UID
}

// EventLast is when an event last occurred: the latest of its
// lastTimestamp, eventTime and series' last observation; else its
// firstTimestamp; else its creation.
func EventLast(e *corev1.Event) time.Time {
	var t time.Time
	for _, u := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time} {
		if u.After(t) {
			t = u
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	if t.IsZero() {
		t = e.FirstTimestamp.Time
	}
	if t.IsZero() {
		t = e.CreationTimestamp.Time
	}
	return t
}

// EventFirst is when an event first occurred.
func EventFirst(e *corev1.Event) time.Time {
	switch {
	case !e.FirstTimestamp.IsZero():
		return e.FirstTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return EventLast(e)
}

// EventCount is how many times an event occurred.
func EventCount(e *corev1.Event) int32 {
	n := e.Count
	if e.Series != nil && e.Series.Count > n {
		n = e.Series.Count
	}
	return max(n, 1)
}

// CompareEvents orders events by when they last occurred, then by their
// creation, namespace and name.
func CompareEvents(a, b *corev1.Event) int {
	return cmp.Or(EventLast(a).Compare(EventLast(b)), a.CreationTimestamp.Compare(b.CreationTimestamp.Time),
		strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
}

// SortEvents sorts events oldest first, as CompareEvents orders them.
func SortEvents(events []corev1.Event) {
	slices.SortStableFunc(events, func(a, b corev1.Event) int { return CompareEvents(&a, &b) })
}
