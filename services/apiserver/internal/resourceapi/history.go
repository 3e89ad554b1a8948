package resourceapi

import (
	"fmt"
	"sort"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// attrs is what selectors see of an object: enough to match it without
// keeping it.
type attrs struct {
	namespace string
	labels    labels.Set
	fields    fields.Set
}

// attrsOf is obj as selectors see it (nil for nil).
func (k *kind) attrsOf(obj runtime.Object) *attrs {
	if obj == nil {
		return nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil
	}
	return &attrs{namespace: m.GetNamespace(), labels: m.GetLabels(), fields: k.fields(obj)}
}

// event is one write, as watches see it: the object after the write (the
// deleted one, at the deletion's resourceVersion, for a delete) encoded
// once for every watch, and what selectors see of it before and after.
type event struct {
	typ  watch.EventType
	kind *kind
	rv   uint64
	// data is the object as a watch event carries it: JSON, exactly
	// sized; its length is what the event weighs in the history.
	data      []byte
	cur, prev *attrs // nil: absent (before a create, after a delete)
	at        time.Time
	// seq and cum are its kind's event count and their bytes up to and
	// including this one, since the store opened.
	seq, cum uint64
}

func (e *event) size() int64 { return int64(len(e.data)) }

// history is the last changes, oldest first, bounded by Limits. It is
// guarded by the Store's lock.
type history struct {
	lim    Limits
	events []*event
	bytes  int64
	// trimmed is, per kind, the resourceVersion of the newest of its
	// events that left the history (at first, the store's resourceVersion
	// at open: nothing before it is kept). A watch of the kind from an
	// older resourceVersion has missed changes.
	trimmed map[*kind]uint64
	// seq and cum are, per kind, the events written and their bytes.
	seq, cum map[*kind]uint64
}

func newHistory(lim Limits, rv uint64) *history {
	h := &history{lim: lim, trimmed: map[*kind]uint64{}, seq: map[*kind]uint64{}, cum: map[*kind]uint64{}}
	for _, k := range allKinds {
		h.trimmed[k] = rv
	}
	return h
}

// add appends ev, numbering it within its kind.
func (h *history) add(ev *event) {
	h.seq[ev.kind]++
	h.cum[ev.kind] += uint64(ev.size())
	ev.seq, ev.cum = h.seq[ev.kind], h.cum[ev.kind]
	h.events = append(h.events, ev)
	h.bytes += ev.size()
}

// trim drops the oldest events while the history holds more than its
// bounds, or events older than HistoryAge at now. It returns the bytes
// dropped.
func (h *history) trim(now time.Time) int64 {
	drop, dropped := 0, int64(0)
	for drop < len(h.events) {
		ev := h.events[drop]
		n, b := len(h.events)-drop, h.bytes-dropped
		if n <= h.lim.HistoryEvents && b <= h.lim.HistoryBytes && now.Sub(ev.at) <= h.lim.HistoryAge {
			break
		}
		h.trimmed[ev.kind] = ev.rv
		dropped += ev.size()
		drop++
	}
	if drop == 0 {
		return 0
	}
	rest := copy(h.events, h.events[drop:])
	clear(h.events[rest:]) // let the dropped events go
	h.events = h.events[:rest]
	if cap(h.events) > 64 && rest < cap(h.events)/4 {
		h.events = append([]*event(nil), h.events...)
	}
	h.bytes -= dropped
	return dropped
}

// since returns k's events after rv, oldest first.
func (h *history) since(k *kind, rv uint64) []*event {
	i := sort.Search(len(h.events), func(i int) bool { return h.events[i].rv > rv })
	var out []*event
	for _, ev := range h.events[i:] {
		if ev.kind == k {
			out = append(out, ev)
		}
	}
	return out
}

// countersAt is k's event count and bytes as they were at rv (which the
// history covers for k).
func (h *history) countersAt(k *kind, rv uint64) (seq, cum uint64) {
	if evs := h.since(k, rv); len(evs) > 0 {
		return evs[0].seq - 1, evs[0].cum - uint64(evs[0].size())
	}
	return h.seq[k], h.cum[k]
}

// Why a watch was cut off: the bound it hit (the label of
// nodeplug_resource_api_watch_cutoffs_total), or boundStopped when the
// store closed.
const (
	boundEvents  = "buffer_events"
	boundBytes   = "buffer_bytes"
	boundHistory = "history"
	boundStopped = "stopped"
)

// watcher is one open watch of a kind. It holds no events: it reads the
// history from its position, and is cut off when it falls too far behind.
type watcher struct {
	kind *kind
	user string
	// rv, seq and cum are its position: the resourceVersion up to which
	// it was sent its kind's events, and its kind's counters there. Its
	// goroutine moves them under the store's read lock; writes read them
	// under the write lock.
	rv, seq, cum uint64
	// cut is closed when the watch must end; bound says why (set before).
	cut   chan struct{}
	bound string
	lag   string // how far behind it was, for the log
	// abort ends a write to the client in progress (a client that does
	// not read blocks it); it runs on a goroutine of its own.
	abort func()
}

// behind says which bound w has exceeded, if any, and by how much.
func (h *history) behind(w *watcher) (bound, lag string) {
	k := w.kind
	switch {
	case h.trimmed[k] > w.rv:
		return boundHistory, "changes it was not sent left the history"
	case h.seq[k]-w.seq > uint64(h.lim.WatchBufferEvents):
		return boundEvents, fmt.Sprintf("%d events behind, the limit is %d", h.seq[k]-w.seq, h.lim.WatchBufferEvents)
	case h.cum[k]-w.cum > uint64(h.lim.WatchBufferBytes):
		return boundBytes, fmt.Sprintf("%d bytes behind, the limit is %d", h.cum[k]-w.cum, h.lim.WatchBufferBytes)
	}
	return "", ""
}
