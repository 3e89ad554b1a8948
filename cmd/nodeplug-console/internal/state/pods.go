package state

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/nodeplug/nodeplug/pkg/podinfo"
	"github.com/nodeplug/nodeplug/pkg/version"
)

// API is the name Snapshot.Status gives the node-local resource API
// (nodeplug-apiserver), whose Pods and Events the Pods view shows.
const API = "apiserver"

// podEvents selects the events about pods.
const podEvents = "involvedObject.kind=Pod"

// watchTimeout is how long one watch of the API lasts before it is opened
// again from the last resourceVersion seen (as client-go's reflector
// renews its watches).
const watchTimeout = 5 * time.Minute

// followAPI follows the Pods and the pods' Events of the node-local API as
// the other watches follow their streams: a list of each is the snapshot
// that replaces what the state held, then a watch from the list's
// resourceVersion applies each change. The kubeconfig is read again at
// each connection, so a restarted nodeplug-apiserver (on another port,
// with another CA) is followed too. Either watch failing (a 410 Gone
// among them: its resourceVersion left the API's history) ends both, and
// the retry lists again.
func (s *State) followAPI(ctx context.Context) error {
	cs, err := apiClient(s.conns.Kubeconfig)
	if err != nil {
		s.setStatus(API, err.Error())
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	pods, err := cs.CoreV1().Pods("").List(lctx, metav1.ListOptions{})
	var events *corev1.EventList
	if err == nil {
		events, err = cs.CoreV1().Events("").List(lctx, metav1.ListOptions{FieldSelector: podEvents})
	}
	cancel()
	if err != nil {
		s.setStatus(API, describeAPI(err))
		return err
	}
	podMap := make(map[string]*corev1.Pod, len(pods.Items))
	for i := range pods.Items {
		podMap[key(&pods.Items[i])] = &pods.Items[i]
	}
	eventMap := make(map[string]*corev1.Event, len(events.Items))
	for i := range events.Items {
		eventMap[key(&events.Items[i])] = &events.Items[i]
	}
	s.update(func() {
		s.pods, s.events, s.status[API] = podMap, eventMap, ""
		s.podList, s.eventList = nil, nil
	})
	s.synced(API, len(podMap)+len(eventMap))
	s.refreshDRA()
	s.refreshAllocations()

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return watchKind(gctx, func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return cs.CoreV1().Pods("").Watch(ctx, opts)
		}, pods.ResourceVersion, func(typ watch.EventType, p *corev1.Pod) {
			s.update(func() {
				if typ == watch.Deleted {
					delete(s.pods, key(p))
				} else {
					s.pods[key(p)] = p
				}
				s.podList = nil
			})
			// A pod's change often comes with its claims' (made,
			// prepared, released) and its devices' (allocated, freed).
			s.refreshDRA()
			s.refreshAllocations()
		})
	})
	g.Go(func() error {
		return watchKind(gctx, func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.FieldSelector = podEvents
			return cs.CoreV1().Events("").Watch(ctx, opts)
		}, events.ResourceVersion, func(typ watch.EventType, e *corev1.Event) {
			s.update(func() {
				if typ == watch.Deleted {
					delete(s.events, key(e))
				} else {
					s.events[key(e)] = e
				}
				s.eventList = nil
			})
		})
	})
	err = g.Wait()
	s.setStatus(API, describeAPI(err))
	return err
}

func key(o metav1.Object) string { return o.GetNamespace() + "/" + o.GetName() }

// apiClient is a client of the API of the kubeconfig file.
func apiClient(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w (is nodeplug-apiserver running?)", kubeconfig, err)
	}
	cfg.UserAgent = "nodeplug-console/" + version.Version
	return kubernetes.NewForConfig(cfg)
}

// watchKind watches one kind from resourceVersion rv, handing each
// addition, change and deletion to apply, until the watch fails or ctx
// ends. A watch the API closes (at its timeout) is opened again from the
// last resourceVersion seen, bookmarks included.
func watchKind[T metav1.Object](ctx context.Context, open func(context.Context, metav1.ListOptions) (watch.Interface, error), rv string, apply func(watch.EventType, T)) error {
	for {
		timeout := int64(watchTimeout / time.Second)
		w, err := open(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout})
		if err != nil {
			return err
		}
		start, changes := time.Now(), 0
		rv, changes, err = drain(ctx, w, rv, apply)
		w.Stop()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return err
		case changes == 0 && time.Since(start) < time.Second:
			// Not the timeout: the API ended it at once.
			return errors.New("watch ended at once")
		}
	}
}

// drain applies a watch's changes until it closes; it returns the last
// resourceVersion seen and how many changes it applied.
func drain[T metav1.Object](ctx context.Context, w watch.Interface, rv string, apply func(watch.EventType, T)) (string, int, error) {
	n := 0
	for {
		select {
		case <-ctx.Done():
			return rv, n, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				return rv, n, nil
			}
			switch ev.Type {
			case watch.Error:
				return rv, n, apierrors.FromObject(ev.Object)
			case watch.Bookmark:
				if o, ok := ev.Object.(metav1.Object); ok && o.GetResourceVersion() != "" {
					rv = o.GetResourceVersion()
				}
			case watch.Added, watch.Modified, watch.Deleted:
				o, ok := ev.Object.(T)
				if !ok {
					continue
				}
				rv = cmp.Or(o.GetResourceVersion(), rv)
				apply(ev.Type, o)
				n++
			}
		}
	}
}

// describeAPI turns an error of the API into its status line: the
// API's own refusal, or why it cannot be reached.
func describeAPI(err error) string {
	var status apierrors.APIStatus
	var uerr *url.Error
	switch {
	case err == nil:
		return "watch ended"
	case errors.As(err, &status):
		st := status.Status()
		return cmp.Or(string(st.Reason), "Failure") + ": " + st.Message
	case errors.As(err, &uerr):
		msg := uerr.Err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 && strings.Contains(msg, "dial") {
			msg = msg[i+2:]
		}
		return "unreachable: " + msg
	}
	return err.Error()
}

// podsSorted and eventsSorted are the pods by namespace and name and the
// events oldest first, sorted once per change; s.mu is held.
func (s *State) podsSorted() []*corev1.Pod {
	if s.podList == nil {
		s.podList = make([]*corev1.Pod, 0, len(s.pods))
		for _, p := range s.pods {
			s.podList = append(s.podList, p)
		}
		slices.SortFunc(s.podList, func(a, b *corev1.Pod) int {
			return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Name, b.Name))
		})
	}
	return s.podList
}

func (s *State) eventsSorted() []*corev1.Event {
	if s.eventList == nil {
		s.eventList = make([]*corev1.Event, 0, len(s.events))
		for _, e := range s.events {
			s.eventList = append(s.eventList, e)
		}
		slices.SortFunc(s.eventList, podinfo.CompareEvents)
	}
	return s.eventList
}
