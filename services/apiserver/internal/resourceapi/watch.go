package resourceapi

import (
	"fmt"
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
// client goes, timeoutSeconds pass, the server stops, or the client falls
// too far behind (it then watches again from its last resourceVersion).
func (s *Server) watch(w http.ResponseWriter, r *http.Request, req request) error {
	opts, err := listOptions(r)
	if err != nil {
		return err
	}
	match, _, err := matcher(req.kind, req.namespace, opts)
	if err != nil {
		return err
	}
	start, err := watchStartOf(opts)
	if err != nil {
		return err
	}
	if start.initial && start.from > s.store.ResourceVersion() {
		return tooLargeRV(start.from, s.store.ResourceVersion())
	}
	wt, objs, past, rv, err := s.store.subscribe(req.kind, start.from, start.initial)
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
		if match(obj) {
			ew.send(watch.Added, obj)
		}
	}
	last := rv
	for _, ev := range past {
		ew.event(ev, match)
		last = ev.rv
	}
	if start.listEnd {
		ew.bookmark(last, true)
	}
	if err := ew.flush(); err != nil {
		return nil
	}
	s.streamEvents(r, ew, wt, match, opts, last)
	return nil
}

// streamEvents is the live part of a watch.
func (s *Server) streamEvents(r *http.Request, ew *eventWriter, wt *watcher, match func(runtime.Object) bool, opts metav1.ListOptions, last uint64) {
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
		select {
		case <-r.Context().Done():
			return
		case <-timeout:
			return
		case <-wt.overflow:
			return
		case <-bookmarks:
			ew.bookmark(last, false)
		case ev := <-wt.ch:
			ew.event(ev, match)
			last = ev.rv
		drain:
			for {
				select {
				case ev := <-wt.ch:
					ew.event(ev, match)
					last = ev.rv
				default:
					break drain
				}
			}
		}
		if ew.flush() != nil {
			return
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
func (e *eventWriter) event(ev event, match func(runtime.Object) bool) {
	now := ev.obj != nil && ev.typ != watch.Deleted && match(ev.obj)
	was := ev.prev != nil && match(ev.prev)
	switch {
	case ev.typ == watch.Deleted && was:
		e.send(watch.Deleted, ev.obj)
	case ev.typ == watch.Deleted:
	case now && was:
		e.send(watch.Modified, ev.obj)
	case now:
		e.send(watch.Added, ev.obj)
	case was:
		e.send(watch.Deleted, ev.obj)
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

func (e *eventWriter) send(typ watch.EventType, obj runtime.Object) {
	if e.err != nil {
		return
	}
	info := jsonInfo()
	data, err := runtime.Encode(info.Serializer, obj)
	if err != nil {
		e.err = fmt.Errorf("encode watch event: %w", err)
		return
	}
	ev := &metav1.WatchEvent{Type: string(typ), Object: runtime.RawExtension{Raw: data}}
	e.err = info.StreamSerializer.Encode(ev, info.StreamSerializer.NewFrameWriter(e.w))
}

func (e *eventWriter) flush() error {
	if e.err == nil {
		if f, ok := e.w.(http.Flusher); ok {
			f.Flush()
		}
	}
	return e.err
}
