package resourceapi

import (
	"bytes"
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

var (
	metaBucket = []byte("meta")
	rvKey      = []byte("resourceVersion")
)

// Store keeps the API's objects: in memory for reads, in a bbolt file for
// durability. Every write is one bbolt transaction, committed (fsynced)
// before the write returns, and takes the next resourceVersion from one
// counter kept in the same file, so resourceVersions only grow, across
// restarts too. Objects held are never modified: a write replaces them.
// It keeps the last writes, bounded by its Limits, for watches, and cuts
// off a watch that falls behind them. It is safe for concurrent use; no
// lock is held while a watch writes to its client.
type Store struct {
	db  *bolt.DB
	lim Limits

	mu   sync.RWMutex
	rv   uint64
	objs map[*kind]map[string]runtime.Object
	hist *history
	// changed is closed (and replaced) at every write: watches wait on it.
	changed  chan struct{}
	watchers map[*watcher]struct{}
}

// OpenStore opens (creating it, 0600) the store's file; lim's zero
// fields take the defaults.
func OpenStore(path string, lim Limits) (*Store, error) {
	lim = lim.WithDefaults()
	if err := lim.Validate(); err != nil {
		return nil, fmt.Errorf("resource API limits: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second, OpenFile: openNoFollow})
	if err != nil {
		return nil, fmt.Errorf("open resource API store %s: %w", path, err)
	}
	s := &Store{db: db, lim: lim, objs: map[*kind]map[string]runtime.Object{}, watchers: map[*watcher]struct{}{}, changed: make(chan struct{})}
	if err := s.load(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("resource API store %s: %w", path, err)
	}
	s.hist = newHistory(lim, s.rv)
	return s, nil
}

// Limits are the store's limits, with their defaults.
func (s *Store) Limits() Limits { return s.lim }

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
	obj, _, err := storageCodec.Decode(data, nil, k.newObj())
	if err != nil {
		return nil, err
	}
	k.setTypeMeta(obj)
	return obj, nil
}

// Close closes the file. Open watches end.
func (s *Store) Close() error {
	s.mu.Lock()
	var cut []*watcher
	for w := range s.watchers {
		cut = append(cut, s.cutLocked(w, boundStopped, ""))
	}
	s.mu.Unlock()
	abortAll(cut)
	return s.db.Close()
}

// ResourceVersion is the last resourceVersion given out.
func (s *Store) ResourceVersion() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.rv
}

// count is how many objects of k are stored.
func (s *Store) count(k *kind) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.objs[k])
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
// memory and the history. It returns the object stored (or deleted). An
// object larger than MaxObjectBytes, encoded, is 413.
func (s *Store) mutate(k *kind, key string, fn func(old runtime.Object) (runtime.Object, error)) (runtime.Object, error) {
	s.mu.Lock()
	cut, out, err := s.mutateLocked(k, key, fn)
	s.mu.Unlock()
	abortAll(cut)
	return out, err
}

func (s *Store) mutateLocked(k *kind, key string, fn func(old runtime.Object) (runtime.Object, error)) ([]*watcher, runtime.Object, error) {
	prev := s.objs[k][key]
	var cur runtime.Object
	if prev != nil {
		cur = prev.DeepCopyObject()
	}
	next, err := fn(cur)
	if errors.Is(err, errNoChange) {
		return nil, prev, nil
	}
	if err != nil || (next == nil && prev == nil) {
		return nil, nil, err
	}
	rv := s.rv + 1
	ev := &event{kind: k, rv: rv, prev: k.attrsOf(prev), cur: k.attrsOf(next), at: time.Now()}
	switch {
	case next == nil:
		ev.typ, next = watch.Deleted, withRV(k, prev.DeepCopyObject(), rv)
		ev.cur = nil
	case prev == nil:
		ev.typ = watch.Added
	default:
		ev.typ = watch.Modified
	}
	data, err := encodeStored(k, key, withRV(k, next, rv))
	if err != nil {
		return nil, nil, err
	}
	if limit := k.objectLimit(); ev.typ != watch.Deleted && len(data) > limit {
		return nil, nil, apierrors.NewRequestEntityTooLargeError(fmt.Sprintf(
			"the %s %s is %d bytes encoded; the node-local API stores %ss of at most %d bytes", k.gvk.Kind, key, len(data), k.gvk.Kind, limit))
	}
	if err := s.commit(k, key, rv, data, ev.typ == watch.Deleted); err != nil {
		return nil, nil, err
	}
	s.rv = rv
	if ev.typ == watch.Deleted {
		delete(s.objs[k], key)
	} else {
		s.objs[k][key] = next
	}
	// The event keeps the encoding alone, exactly sized, without the
	// encoder's newline.
	ev.data = bytes.Clone(bytes.TrimSuffix(data, []byte("\n")))
	return s.recordLocked(ev), next, nil
}

// withRV sets obj's type meta and resourceVersion, and returns it.
func withRV(k *kind, obj runtime.Object, rv uint64) runtime.Object {
	k.setTypeMeta(obj)
	if m, err := meta.Accessor(obj); err == nil {
		m.SetResourceVersion(strconv.FormatUint(rv, 10))
	}
	return obj
}

func encodeStored(k *kind, key string, obj runtime.Object) ([]byte, error) {
	data, err := runtime.Encode(storageCodec, obj)
	if err != nil {
		return nil, apierrors.NewInternalError(fmt.Errorf("encode %s %s: %w", k.resource, key, err))
	}
	return data, nil
}

// commit writes (or, with del, deletes) one object and the counter in one
// transaction.
func (s *Store) commit(k *kind, key string, rv uint64, data []byte, del bool) error {
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(k.resource))
		var err error
		if del {
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
	})
	if err != nil {
		return apierrors.NewInternalError(fmt.Errorf("store %s %s: %w", k.resource, key, err))
	}
	return nil
}

// recordLocked keeps ev in the history, trims it, wakes the watches and
// returns those it cut off.
func (s *Store) recordLocked(ev *event) []*watcher {
	s.hist.add(ev)
	cut := s.trimLocked(ev.at)
	close(s.changed)
	s.changed = make(chan struct{})
	return cut
}

// trimLocked trims the history at now and cuts off the watches that fell
// behind its bounds.
func (s *Store) trimLocked(now time.Time) []*watcher {
	s.hist.trim(now)
	var cut []*watcher
	for w := range s.watchers {
		if bound, lag := s.hist.behind(w); bound != "" {
			cut = append(cut, s.cutLocked(w, bound, lag))
		}
	}
	return cut
}

// Expire drops the changes older than the history's age (and with them
// the watches still owed them), and returns the bytes dropped. The server
// calls it periodically: without writes the history would keep its last
// changes for ever.
func (s *Store) Expire(now time.Time) int64 {
	s.mu.Lock()
	before := s.hist.bytes
	cut := s.trimLocked(now)
	dropped := before - s.hist.bytes
	s.mu.Unlock()
	abortAll(cut)
	return dropped
}

// HistorySize is the events the history holds and their bytes.
func (s *Store) HistorySize() (events int, bytes int64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return len(s.hist.events), s.hist.bytes
}

// cutLocked ends w's watch because of bound, and returns it.
func (s *Store) cutLocked(w *watcher, bound, lag string) *watcher {
	delete(s.watchers, w)
	w.bound, w.lag = bound, lag
	close(w.cut)
	return w
}

// abortAll ends the writes in progress of watches that were cut off.
// It runs after the lock is released: ending a write takes the HTTP
// connection's own locks.
func abortAll(cut []*watcher) {
	for _, w := range cut {
		if w.abort != nil {
			go w.abort()
		}
	}
}

// subscribe starts a watch of k for user. With start.initial it returns
// the current objects, and the watch is at the store's resourceVersion;
// otherwise it is at start.from, or 410 Gone when changes of k after it
// left the history. abort ends a write to its client (see watcher).
func (s *Store) subscribe(k *kind, start watchStart, user string, abort func()) (*watcher, []runtime.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if start.from > s.rv {
		return nil, nil, tooLargeRV(start.from, s.rv)
	}
	w := &watcher{kind: k, user: user, cut: make(chan struct{}), abort: abort}
	var objs []runtime.Object
	if start.initial {
		objs = s.listLocked(k, func(runtime.Object) bool { return true })
		w.rv, w.seq, w.cum = s.rv, s.hist.seq[k], s.hist.cum[k]
	} else {
		if start.from < s.hist.trimmed[k] {
			return nil, nil, apierrors.NewResourceExpired(
				fmt.Sprintf("too old resource version: %d (%d)", start.from, s.hist.trimmed[k]))
		}
		w.rv = start.from
		w.seq, w.cum = s.hist.countersAt(k, start.from)
	}
	s.watchers[w] = struct{}{}
	return w, objs, nil
}

// pending returns w's events after its position, the resourceVersion
// they run to, and a channel closed at the next write; ok is false once
// w was cut off (the events it is owed may be gone).
func (s *Store) pending(w *watcher) (evs []*event, head uint64, changed <-chan struct{}, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if w.bound != "" {
		return nil, 0, nil, false
	}
	return s.hist.since(w.kind, w.rv), s.rv, s.changed, true
}

// sent moves w's position past ev, once it was written to the client.
func (s *Store) sent(w *watcher, ev *event) {
	s.mu.RLock()
	w.rv, w.seq, w.cum = ev.rv, ev.seq, ev.cum
	s.mu.RUnlock()
}

// caughtUp moves w's position to head, once every event of its kind up
// to head was written.
func (s *Store) caughtUp(w *watcher, head uint64) {
	s.mu.RLock()
	w.rv = max(w.rv, head)
	s.mu.RUnlock()
}

// position is the resourceVersion w was sent everything up to (its own
// goroutine's read).
func (w *watcher) position() uint64 { return w.rv }

// unsubscribe ends a watch.
func (s *Store) unsubscribe(w *watcher) {
	s.mu.Lock()
	delete(s.watchers, w)
	s.mu.Unlock()
}

// tooLargeRV is the error of a real server asked for a resourceVersion it
// has not reached (client-go recognises it by its cause).
func tooLargeRV(want, current uint64) error {
	err := apierrors.NewTimeoutError(fmt.Sprintf("Too large resource version: %d, current: %d", want, current), 1)
	err.ErrStatus.Details.Causes = []metav1.StatusCause{{
		Type: metav1.CauseTypeResourceVersionTooLarge, Message: "Too large resource version",
	}}
	return err
}
