package resourceapi

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// watchStart is where a watch begins, from its options.
type watchStart struct {
	from uint64
	// initial: send the current objects as ADDED first.
	initial bool
	// listEnd: end the initial events with a BOOKMARK annotated
	// k8s.io/initial-events-end (the watch-list request).
	listEnd bool
}

// watchStartOf reads the options as the API server does: a watch-list
// request (sendInitialEvents=true) needs resourceVersionMatch=NotOlderThan
// and bookmarks; a watch from "" or "0" starts with the current objects;
// a watch from N gets the events after N.
func watchStartOf(opts metav1.ListOptions) (watchStart, error) {
	from, err := parseRV(opts.ResourceVersion)
	if err != nil {
		return watchStart{}, err
	}
	if opts.SendInitialEvents != nil {
		if opts.ResourceVersionMatch != metav1.ResourceVersionMatchNotOlderThan {
			return watchStart{}, apierrors.NewBadRequest("sendInitialEvents requires resourceVersionMatch=NotOlderThan")
		}
		if *opts.SendInitialEvents {
			if !opts.AllowWatchBookmarks {
				return watchStart{}, apierrors.NewBadRequest("sendInitialEvents requires allowWatchBookmarks=true")
			}
			return watchStart{from: from, initial: true, listEnd: true}, nil
		}
		return watchStart{from: from, initial: from == 0}, nil
	}
	if opts.ResourceVersionMatch != "" {
		return watchStart{}, apierrors.NewBadRequest("resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided")
	}
	return watchStart{from: from, initial: from == 0}, nil
}

// watch streams events as newline-delimited JSON WatchEvents until the
// client goes, timeoutSeconds pass, the server stops, or the watch is cut
// off for falling too far behind (see Limits; the client watches again
// from its last resourceVersion, and lists again when that is gone). A
// watch beyond the limits per caller or in total is 429.
func (s *Server) watch(w http.ResponseWriter, r *http.Request, req request) error {
	opts, match, err := selection(r, req)
	if err != nil {
		return err
	}
	start, err := watchStartOf(opts)
	if err != nil {
		return err
	}
	release, bound, err := s.watches.take(req.user.name)
	if err != nil {
		s.metrics.watchesRefused.WithLabelValues(bound).Inc()
		return err
	}
	defer release()
	rc := http.NewResponseController(w)
	wt, objs, err := s.store.subscribe(req.kind, start, req.user.name, func() { _ = rc.SetWriteDeadline(time.Now()) })
	if err != nil {
		return err
	}
	defer s.store.unsubscribe(wt)
	s.metrics.watches.Inc()
	defer s.metrics.watches.Dec()

	ew := &eventWriter{w: w, kind: req.kind}
	w.Header().Set("Content-Type", runtime.ContentTypeJSON)
	w.Header().Set("Cache-Control", "no-cache, private")
	w.WriteHeader(http.StatusOK)
	for _, obj := range objs {
		if match(req.kind.attrsOf(obj)) {
			ew.send(watch.Added, obj)
		}
	}
	if start.listEnd {
		ew.bookmark(wt.position(), true)
	}
	if ew.flush() == nil {
		s.streamEvents(r.Context(), ew, wt, match, opts)
	}
	s.cutOff(wt, req)
	return nil
}

// cutOff logs and counts a watch that was cut off for falling behind.
func (s *Server) cutOff(wt *watcher, req request) {
	select {
	case <-wt.cut:
	default:
		return
	}
	if wt.bound == boundStopped {
		return
	}
	s.metrics.watchCutoffs.WithLabelValues(wt.bound).Inc()
	s.log.Warn("resource API watch cut off: its client fell behind", "user", wt.user, "resource", req.kind.resource,
		"bound", wt.bound, "behind", wt.lag, "resource_version", wt.position())
}

// streamEvents is the live part of a watch: it writes the history from
// the watch's position, then waits for the next write.
func (s *Server) streamEvents(ctx context.Context, ew *eventWriter, wt *watcher, match func(*attrs) bool, opts metav1.ListOptions) {
	var timeout <-chan time.Time
	if opts.TimeoutSeconds != nil && *opts.TimeoutSeconds > 0 {
		t := time.NewTimer(time.Duration(*opts.TimeoutSeconds) * time.Second)
		defer t.Stop()
		timeout = t.C
	}
	var bookmarks <-chan time.Time
	if opts.AllowWatchBookmarks {
		t := time.NewTicker(s.cfg.BookmarkInterval)
		defer t.Stop()
		bookmarks = t.C
	}
	for {
		evs, head, changed, ok := s.store.pending(wt)
		if !ok {
			return
		}
		for _, ev := range evs {
			if ew.event(ev, match); ew.err != nil {
				return
			}
			s.store.sent(wt, ev)
		}
		s.store.caughtUp(wt, head)
		if ew.flush() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-timeout:
			return
		case <-wt.cut:
			return
		case <-bookmarks:
			ew.bookmark(wt.position(), false)
		case <-changed:
		}
	}
}

// eventWriter encodes watch events; the first write error ends the watch.
type eventWriter struct {
	w    http.ResponseWriter
	kind *kind
	err  error
}

// event sends ev as the selectors see it: an object that starts to match
// is ADDED, one that stops matching is DELETED, as the API server does.
func (e *eventWriter) event(ev *event, match func(*attrs) bool) {
	now := ev.cur != nil && match(ev.cur)
	was := ev.prev != nil && match(ev.prev)
	switch {
	case now && was:
		e.raw(watch.Modified, ev.data)
	case now:
		e.raw(watch.Added, ev.data)
	case was:
		e.raw(watch.Deleted, ev.data)
	}
}

// bookmark sends a BOOKMARK at rv: an empty object of the kind holding
// only the resourceVersion (and, after the initial events of a watch-list
// request, the k8s.io/initial-events-end annotation).
func (e *eventWriter) bookmark(rv uint64, listEnd bool) {
	obj := e.kind.newObj()
	e.kind.setTypeMeta(obj)
	m, _ := meta.Accessor(obj)
	m.SetResourceVersion(strconv.FormatUint(rv, 10))
	if listEnd {
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	}
	e.send(watch.Bookmark, obj)
}

// send encodes obj and sends it.
func (e *eventWriter) send(typ watch.EventType, obj runtime.Object) {
	if e.err != nil {
		return
	}
	data, err := runtime.Encode(jsonSerializer, obj)
	if err != nil {
		e.err = fmt.Errorf("encode watch event: %w", err)
		return
	}
	e.raw(typ, bytes.TrimSuffix(data, []byte("\n")))
}

// raw writes one WatchEvent, {"type":...,"object":<data>}, and a newline,
// as the JSON stream serializer frames it, from the object's encoding
// (shared by every watch: it is not copied).
func (e *eventWriter) raw(typ watch.EventType, data []byte) {
	if e.err != nil {
		return
	}
	if _, e.err = io.WriteString(e.w, `{"type":"`+string(typ)+`","object":`); e.err != nil {
		return
	}
	if _, e.err = e.w.Write(data); e.err != nil {
		return
	}
	_, e.err = io.WriteString(e.w, "}\n")
}

func (e *eventWriter) flush() error {
	if e.err == nil {
		if f, ok := e.w.(http.Flusher); ok {
			f.Flush()
		}
	}
	return e.err
}
