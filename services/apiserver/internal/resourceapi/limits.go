package resourceapi

import (
	"errors"
	"fmt"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
)

// What a request and an object may weigh. kube-apiserver reads request
// bodies of up to 3 MiB and etcd stores values of up to 1.5 MiB; the
// node-local API takes the same body and stores objects of at most 1.5
// MiB, encoded as JSON (the form it keeps them in and sends to watches).
const (
	// MaxBodyBytes bounds a request body: a larger one is 413 before it
	// is read.
	MaxBodyBytes = 3 << 20
	// MaxObjectBytes bounds an object as stored: a create, update or
	// patch whose result is larger is 413.
	MaxObjectBytes = 1536 << 10
)

// Defaults of Limits.
const (
	DefaultHistoryEvents       = 4096
	DefaultHistoryBytes        = 32 << 20
	DefaultHistoryAge          = 30 * time.Second
	DefaultWatchBufferEvents   = 1024
	DefaultWatchBufferBytes    = 8 << 20
	DefaultMaxWatches          = 1000
	DefaultMaxWatchesPerCaller = 250
)

// Limits bound the memory the API holds for its watches, whatever its
// clients send and however slowly they read. Zero fields take the
// defaults.
type Limits struct {
	// HistoryEvents, HistoryBytes and HistoryAge bound the watch history,
	// the last changes kept so that a watch can start from a
	// resourceVersion: it keeps at most HistoryEvents changes whose
	// objects weigh at most HistoryBytes (encoded), none older than
	// HistoryAge. A watch from a resourceVersion whose later changes of
	// its kind left the history is 410 Gone: the client lists again.
	HistoryEvents int
	HistoryBytes  int64
	HistoryAge    time.Duration
	// WatchBufferEvents and WatchBufferBytes bound how far one watch may
	// fall behind the changes of its kind (a client that does not read):
	// beyond either, or once a change it was not sent leaves the history,
	// its stream is cut off. A watch holds no copy of what it is owed
	// (it reads the history), so a slow watch costs no more than the
	// history.
	WatchBufferEvents int
	WatchBufferBytes  int64
	// MaxWatches and MaxWatchesPerCaller bound the watches open at once,
	// in total and per caller (a client certificate's CommonName); one
	// more is 429 TooManyRequests.
	MaxWatches          int
	MaxWatchesPerCaller int
	// EventTTL is how long an Event is kept after it last occurred;
	// MaxEvents how many are kept at most, the oldest going first.
	EventTTL  time.Duration
	MaxEvents int
}

// WithDefaults returns l with its zero fields set to the defaults.
func (l Limits) WithDefaults() Limits {
	set := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	set64 := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	set(&l.HistoryEvents, DefaultHistoryEvents)
	set64(&l.HistoryBytes, DefaultHistoryBytes)
	if l.HistoryAge <= 0 {
		l.HistoryAge = DefaultHistoryAge
	}
	set(&l.WatchBufferEvents, DefaultWatchBufferEvents)
	set64(&l.WatchBufferBytes, DefaultWatchBufferBytes)
	set(&l.MaxWatches, DefaultMaxWatches)
	set(&l.MaxWatchesPerCaller, DefaultMaxWatchesPerCaller)
	if l.EventTTL <= 0 {
		l.EventTTL = DefaultEventTTL
	}
	set(&l.MaxEvents, DefaultMaxEvents)
	return l
}

// Validate checks that the limits (with their defaults) can serve the
// largest object: a watch buffer or a history smaller than one would cut
// off every watch that is sent one.
func (l Limits) Validate() error {
	l = l.WithDefaults()
	var errs []error
	if l.WatchBufferBytes < MaxObjectBytes {
		errs = append(errs, fmt.Errorf("the watch buffer (%d bytes) is smaller than the largest object (%d bytes)", l.WatchBufferBytes, MaxObjectBytes))
	}
	if l.HistoryBytes < l.WatchBufferBytes {
		errs = append(errs, fmt.Errorf("the watch history (%d bytes) is smaller than a watch buffer (%d bytes)", l.HistoryBytes, l.WatchBufferBytes))
	}
	if l.MaxWatchesPerCaller > l.MaxWatches {
		errs = append(errs, fmt.Errorf("the watches per caller (%d) exceed the watches in total (%d)", l.MaxWatchesPerCaller, l.MaxWatches))
	}
	return errors.Join(errs...)
}

// Bytes is a size given as a flag: a number of bytes or a quantity such as
// 32Mi.
type Bytes int64

// String implements flag.Value.
func (b *Bytes) String() string {
	return apiresource.NewQuantity(int64(*b), apiresource.BinarySI).String()
}

// Set implements flag.Value.
func (b *Bytes) Set(s string) error {
	q, err := apiresource.ParseQuantity(s)
	if err != nil {
		return fmt.Errorf("%q is not a size (bytes, or a quantity such as 32Mi): %w", s, err)
	}
	if q.Sign() < 0 {
		return fmt.Errorf("%q: a size cannot be negative", s)
	}
	*b = Bytes(q.Value())
	return nil
}

// The bounds a refused watch names (the label of
// nodeplug_resource_api_watches_refused_total).
const (
	boundPerCaller = "per_caller"
	boundTotal     = "total"
)

// watchSlots admits watches up to the limits in total and per caller.
// It is safe for concurrent use.
type watchSlots struct {
	max, perCaller int

	mu   sync.Mutex
	open int
	by   map[string]int
}

func newWatchSlots(l Limits) *watchSlots {
	return &watchSlots{max: l.MaxWatches, perCaller: l.MaxWatchesPerCaller, by: map[string]int{}}
}

// take admits one more watch of caller, or returns 429 naming the bound
// it hit (and the bound, for the metric). release gives the slot back.
func (w *watchSlots) take(caller string) (release func(), bound string, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.by[caller] >= w.perCaller:
		return nil, boundPerCaller, apierrors.NewTooManyRequests(fmt.Sprintf(
			"watch refused: %s already has %d watches open, the limit per caller", caller, w.perCaller), 1)
	case w.open >= w.max:
		return nil, boundTotal, apierrors.NewTooManyRequests(fmt.Sprintf(
			"watch refused: %d watches are open, the limit in total", w.max), 1)
	}
	w.open++
	w.by[caller]++
	var once sync.Once
	return func() { once.Do(func() { w.give(caller) }) }, "", nil
}

func (w *watchSlots) give(caller string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.open--
	if w.by[caller]--; w.by[caller] <= 0 {
		delete(w.by, caller)
	}
}
