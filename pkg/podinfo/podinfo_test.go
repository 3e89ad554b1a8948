package podinfo

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// TestClaimRefs: a claim the pod names is itself; a template's is the one
// status.resourceClaimStatuses names, or none before it is made; the
// claim of its DRA extended resources is named after the others.
func TestClaimRefs(t *testing.T) {
	p := &corev1.Pod{
		Spec: corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{
			{Name: "shared", ResourceClaimName: ptr.To("team-gpu")},
			{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")},
			{Name: "nic", ResourceClaimTemplateName: ptr.To("one-nic")},
		}},
		Status: corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("p-gpu-x7k2p")}}},
	}
	want := []ClaimRef{{"shared", "team-gpu", ""}, {"gpu", "p-gpu-x7k2p", "one-gpu"}, {"nic", "", "one-nic"}}
	if got := ClaimRefs(p); !slices.Equal(got, want) {
		t.Fatalf("ClaimRefs = %+v, want %+v", got, want)
	}
	// The claim made for the pod's DRA extended resources comes last,
	// under a name none of the spec's claims has.
	p.Status.ExtendedResourceClaimStatus = &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: "p-extended-resources-4hf6q"}
	p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "extended-resources", ResourceClaimName: ptr.To("mine")},
		corev1.PodResourceClaim{Name: "extended-resources-2", ResourceClaimName: ptr.To("also-mine")})
	want = append(want, ClaimRef{"extended-resources", "mine", ""}, ClaimRef{"extended-resources-2", "also-mine", ""}, ClaimRef{"extended-resources-3", "p-extended-resources-4hf6q", ""})
	if got := ClaimRefs(p); !slices.Equal(got, want) {
		t.Fatalf("ClaimRefs with an extended-resource claim = %+v, want %+v", got, want)
	}
}

// TestEventTimes: an event last occurred at the latest of its times, a
// series' last observation among them; it occurred at least once; an
// event naming another UID is not the pod's; events sort oldest first.
func TestEventTimes(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(t0.Add(d)) }
	legacy := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "a"}, FirstTimestamp: at(0), LastTimestamp: at(time.Minute), Count: 3}
	series := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: "b"}, EventTime: metav1.NewMicroTime(t0.Add(-time.Hour)),
		Series: &corev1.EventSeries{Count: 7, LastObservedTime: metav1.NewMicroTime(t0.Add(2 * time.Minute))},
	}
	created := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "c", CreationTimestamp: at(30 * time.Second)}}
	for _, tc := range []struct {
		e           *corev1.Event
		first, last time.Time
		count       int32
	}{
		{legacy, t0, t0.Add(time.Minute), 3},
		{series, t0.Add(-time.Hour), t0.Add(2 * time.Minute), 7},
		{created, t0.Add(30 * time.Second), t0.Add(30 * time.Second), 1},
	} {
		if f, l, n := EventFirst(tc.e), EventLast(tc.e), EventCount(tc.e); !f.Equal(tc.first) || !l.Equal(tc.last) || n != tc.count {
			t.Errorf("event %s: first %v, last %v, count %d; want %v, %v, %d", tc.e.Name, f, l, n, tc.first, tc.last, tc.count)
		}
	}
	events := []corev1.Event{*series, *legacy, *created}
	SortEvents(events)
	var names []string
	for _, e := range events {
		names = append(names, e.Name)
	}
	if !slices.Equal(names, []string{"c", "a", "b"}) {
		t.Errorf("sorted %v, want [c a b]", names)
	}
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "now"}}
	for uid, want := range map[string]bool{"": true, "now": true, "before": false} {
		e := &corev1.Event{InvolvedObject: corev1.ObjectReference{UID: types.UID(uid)}}
		if got := EventOf(e, p); got != want {
			t.Errorf("EventOf with involvedObject.uid %q = %v, want %v", uid, got, want)
		}
	}
}
