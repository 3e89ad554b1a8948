package resourceapi

import (
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Events are bounded as kube-apiserver bounds them, by age (--event-ttl,
// an hour, counted from an event's last occurrence), and further by count
// and size: the node-local API holds at most Limits.MaxEvents of them, the
// oldest going first, each at most MaxEventBytes encoded. Whatever records
// events, and however often, the memory they take stays below
// MaxEvents × MaxEventBytes.
const (
	// MaxEventBytes bounds one Event as stored; a larger one is 413.
	MaxEventBytes = 16 << 10
	// DefaultEventTTL is how long an Event is kept after it last occurred.
	DefaultEventTTL = time.Hour
	// DefaultMaxEvents is how many Events are kept at most.
	DefaultMaxEvents = 4096
)

// lastSeen is when an event last occurred: the latest of its creation,
// its lastTimestamp, its eventTime and its series' last observation.
func lastSeen(e *corev1.Event) time.Time {
	t := e.CreationTimestamp.Time
	for _, u := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time} {
		if u.After(t) {
			t = u
		}
	}
	if e.Series != nil && e.Series.LastObservedTime.After(t) {
		t = e.Series.LastObservedTime.Time
	}
	return t
}

// expireEvents deletes the events that last occurred more than the TTL
// before now, and the oldest writes beyond MaxEvents; it returns how many
// went.
func (s *Server) expireEvents(now time.Time) int {
	lim := s.store.Limits()
	if s.store.count(kindEvent) == 0 {
		return 0
	}
	objs, _ := s.store.list(kindEvent, func(runtime.Object) bool { return true })
	rvOf := func(o runtime.Object) uint64 {
		rv, _ := strconv.ParseUint(o.(*corev1.Event).ResourceVersion, 10, 64)
		return rv
	}
	sort.Slice(objs, func(i, j int) bool { return rvOf(objs[i]) < rvOf(objs[j]) })
	deleted := 0
	for i, o := range objs {
		over := len(objs)-i > lim.MaxEvents
		if !over && now.Sub(lastSeen(o.(*corev1.Event))) <= lim.EventTTL {
			continue
		}
		rv := rvOf(o)
		if _, err := s.store.mutate(kindEvent, objectKey(o), func(cur runtime.Object) (runtime.Object, error) {
			// An event recorded again since it was listed stays.
			if cur == nil || rvOf(cur) != rv {
				return nil, errNoChange
			}
			return nil, nil
		}); err != nil {
			s.log.Warn("resource API: an expired event could not be deleted", "event", objectKey(o), "error", err)
			continue
		}
		deleted++
	}
	return deleted
}
