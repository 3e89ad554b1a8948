package resourceapi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// DefaultHistory is how many events a Store keeps for watches that resume
// from a resourceVersion; a watch from before the oldest gets 410 Gone.
const DefaultHistory = 4096

// watcherBuffer is how many events a watcher may fall behind before its
// stream is ended (the client watches again from its last resourceVersion).
const watcherBuffer = 1024

var (
	metaBucket = []byte("meta")
	rvKey      = []byte("resourceVersion")
)

// Store keeps the API's objects: in memory for reads, in a bbolt file for
// durability. Every write is one bbolt transaction, committed (fsynced)
// before the write returns, and takes the next resourceVersion from one
// counter kept in the same file, so resourceVersions only grow, across
// restarts too. Objects held are never modified: a write replaces them.
type Store struct {
	db      *bolt.DB
	history int

	mu   sync.RWMutex
	rv   uint64
	objs map[*kind]map[string]runtime.Object
	// events holds the last writes, oldest first; a watch from a
	// resourceVersion >= oldest can be served from it.
	events   []event
	oldest   uint64
	watchers map[*watcher]struct{}
}

// event is one write, as watches see it. prev is the object before the
// write (nil on create).
type event struct {
	typ       watch.EventType
	kind      *kind
	obj, prev runtime.Object
	rv        uint64
}

// watcher receives the events written after it subscribed.
type watcher struct {
	kind *kind
	ch   chan event
	// overflow is closed when the watcher fell too far behind.
	overflow chan struct{}
	once     sync.Once
}

// OpenStore opens (creating it, 0600) the store's file; history <= 0
// means DefaultHistory.
func OpenStore(path string, history int) (*Store, error) {
	if history <= 0 {
		history = DefaultHistory
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, OpenFile: openNoFollow})
	if err != nil {
		return nil, fmt.Errorf("open resource API store %s: %w", path, err)
	}
	s := &Store{db: db, history: history, objs: map[*kind]map[string]runtime.Object{}, watchers: map[*watcher]struct{}{}}
	if err := s.load(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("resource API store %s: %w", path, err)
	}
	s.oldest = s.rv
	return s, nil
}

// openNoFollow opens the store's file without following a symbolic link.
func openNoFollow(name string, flag int, perm os.FileMode) (*os.File, error) {
	return os.OpenFile(name, flag|noFollow, perm)
}

// load reads every object and the counter.
func (s *Store) load() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		mb, err := tx.CreateBucketIfNotExists(metaBucket)
		if err != nil {
			return err
		}
		if v := mb.Get(rvKey); len(v) == 8 {
			s.rv = binary.BigEndian.Uint64(v)
		}
		for _, k := range allKinds {
			b, err := tx.CreateBucketIfNotExists([]byte(k.resource))
			if err != nil {
				return err
			}
			m := map[string]runtime.Object{}
			s.objs[k] = m
			if err := b.ForEach(func(key, v []byte) error {
				obj, err := decodeStored(k, v)
				if err != nil {
					return fmt.Errorf("%s %s: %w", k.resource, key, err)
				}
				m[string(key)] = obj
				return nil
			}); err != nil {
				return err
			}
		}
		return nil
	})
}

func decodeStored(k *kind, data []byte) (runtime.Object, error) {
	obj, _, err := storageCodec().Decode(data, nil, k.newObj())
	if err != nil {
		return nil, err
	}
	k.setTypeMeta(obj)
	return obj, nil
}

// storageCodec encodes and decodes objects as stored: JSON with apiVersion
// and kind.
func storageCodec() runtime.Codec {
	return codecs.LegacyCodec(kindSlice.gvk.GroupVersion(), kindNode.gvk.GroupVersion())
}

// Close closes the file. Open watches end.
func (s *Store) Close() error {
	s.mu.Lock()
	for w := range s.watchers {
		w.stop()
		delete(s.watchers, w)
	}
	s.mu.Unlock()
	return s.db.Close()
}

// ResourceVersion is the last resourceVersion given out.
func (s *Store) ResourceVersion() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rv
}

// get returns the stored object (not to be modified) or nil.
func (s *Store) get(k *kind, key string) runtime.Object {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.objs[k][key]
}

// list returns the objects (sorted by key, not to be modified) that match,
// and the resourceVersion the list is at.
func (s *Store) list(k *kind, match func(runtime.Object) bool) ([]runtime.Object, uint64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.listLocked(k, match), s.rv
}

func (s *Store) listLocked(k *kind, match func(runtime.Object) bool) []runtime.Object {
	keys := make([]string, 0, len(s.objs[k]))
	for key, obj := range s.objs[k] {
		if match(obj) {
			keys = append(keys, key)
		}
	}
	sort.Strings(keys)
	out := make([]runtime.Object, len(keys))
	for i, key := range keys {
		out[i] = s.objs[k][key]
	}
	return out
}

// errNoChange, returned by a mutation, ends it without a write.
var errNoChange = errors.New("no change")

// mutate is every write: fn gets the stored object (nil if absent; a copy
// it may change) and returns the object to store, or nil to delete it. The
// store sets the new resourceVersion, writes it durably, then updates
// memory and the watchers. It returns the object stored (or deleted).
func (s *Store) mutate(k *kind, key string, fn func(old runtime.Object) (runtime.Object, error)) (runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.objs[k][key]
	var cur runtime.Object
	if prev != nil {
		cur = prev.DeepCopyObject()
	}
	next, err := fn(cur)
	if errors.Is(err, errNoChange) {
		return prev, nil
	}
	if err != nil {
		return nil, err
	}
	if next == nil && prev == nil {
		return nil, nil
	}
	rv := s.rv + 1
	var data []byte
	if next != nil {
		k.setTypeMeta(next)
		m, err := meta.Accessor(next)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		m.SetResourceVersion(strconv.FormatUint(rv, 10))
		if data, err = runtime.Encode(storageCodec(), next); err != nil {
			return nil, apierrors.NewInternalError(fmt.Errorf("encode %s %s: %w", k.resource, key, err))
		}
	}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(k.resource))
		var err error
		if next == nil {
			err = b.Delete([]byte(key))
		} else {
			err = b.Put([]byte(key), data)
		}
		if err != nil {
			return err
		}
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], rv)
		return tx.Bucket(metaBucket).Put(rvKey, v[:])
	}); err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("store %s %s: %w", k.resource, key, err))
	}
	s.rv = rv
	ev := event{kind: k, obj: next, prev: prev, rv: rv}
	switch {
	case next == nil:
		delete(s.objs[k], key)
		ev.typ, ev.obj = watch.Deleted, deletedCopy(k, prev, rv)
	case prev == nil:
		s.objs[k][key] = next
		ev.typ = watch.Added
	default:
		s.objs[k][key] = next
		ev.typ = watch.Modified
	}
	s.record(ev)
	if next == nil {
		return ev.obj, nil
	}
	return next, nil
}

// deletedCopy is the object as a DELETED event carries it: its last state
// with the deletion's resourceVersion, as a real server sends.
func deletedCopy(k *kind, prev runtime.Object, rv uint64) runtime.Object {
	obj := prev.DeepCopyObject()
	k.setTypeMeta(obj)
	if m, err := meta.Accessor(obj); err == nil {
		m.SetResourceVersion(strconv.FormatUint(rv, 10))
	}
	return obj
}

// record keeps ev in the history and hands it to the watchers of its kind.
func (s *Store) record(ev event) {
	s.events = append(s.events, ev)
	if len(s.events) > s.history {
		drop := len(s.events) - s.history
		s.oldest = s.events[drop-1].rv
		s.events = append(s.events[:0], s.events[drop:]...)
	}
	for w := range s.watchers {
		if w.kind != ev.kind {
			continue
		}
		select {
		case w.ch <- ev:
		default:
			w.stop()
			delete(s.watchers, w)
		}
	}
}

// subscribe starts a watch of k. With from == 0 it returns the current
// objects (initial) and the events after them; otherwise the events after
// from, or 410 Gone when from is older than the history kept. rv is the
// resourceVersion the watch starts at.
func (s *Store) subscribe(k *kind, from uint64, initial bool) (w *watcher, objs []runtime.Object, past []event, rv uint64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !initial {
		if from < s.oldest {
			return nil, nil, nil, 0, apierrors.NewResourceExpired(
				fmt.Sprintf("too old resource version: %d (%d)", from, s.oldest))
		}
		if from > s.rv {
			return nil, nil, nil, 0, tooLargeRV(from, s.rv)
		}
		for _, ev := range s.events {
			if ev.rv > from && ev.kind == k {
				past = append(past, ev)
			}
		}
	} else {
		objs = s.listLocked(k, func(runtime.Object) bool { return true })
	}
	w = &watcher{kind: k, ch: make(chan event, watcherBuffer), overflow: make(chan struct{})}
	s.watchers[w] = struct{}{}
	return w, objs, past, s.rv, nil
}

// unsubscribe ends a watch.
func (s *Store) unsubscribe(w *watcher) {
	s.mu.Lock()
	delete(s.watchers, w)
	s.mu.Unlock()
}

func (w *watcher) stop() { w.once.Do(func() { close(w.overflow) }) }

// tooLargeRV is the error of a real server asked for a resourceVersion it
// has not reached (client-go recognises it by its cause).
func tooLargeRV(want, current uint64) error {
	err := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %d, current: %d", want, current), 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{
		Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version",
	}}
	return err
}
