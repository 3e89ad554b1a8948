package traces

import (
	"container/list"
	"strconv"
	"sync"

	"github.com/nodeplug/nodeplug/cmd/nodeplug-console/internal/signal"
)

// Limits bound a Store. Zero fields take the defaults.
type Limits struct {
	// MaxTraces is how many traces are kept (default 1000).
	MaxTraces int
	// MaxBytes is what the kept spans may weigh together, by their OTLP
	// encoding plus their service name (default 64 MiB).
	MaxBytes int
}

// DefaultLimits are the Store's bounds when none are given.
var DefaultLimits = Limits{MaxTraces: 1000, MaxBytes: 64 << 20}

func (l Limits) withDefaults() Limits {
	if l.MaxTraces <= 0 {
		l.MaxTraces = DefaultLimits.MaxTraces
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	return l
}

// Store keeps the most recent traces within its Limits: when a new span
// would take it past either bound, the trace that arrived first is evicted
// (whole), then the next, until it fits. A span larger than MaxBytes alone
// is not kept. Spans seen again (an exporter's retry) are not added twice.
//
// A Store is safe for concurrent use. Changed wakes its waiters after each
// Add that kept something.
type Store struct {
	limits  Limits
	changed signal.Signal

	mu      sync.Mutex
	byID    map[string]*entry
	order   *list.List // of *entry, oldest first
	bytes   int
	dropped uint64 // spans not kept (too large) or evicted with their trace
}

type entry struct {
	id      string
	spans   []Span
	seen    map[string]bool // span IDs
	procs   map[string]string
	process map[string]Process
	bytes   int
	elem    *list.Element
}

// NewStore returns an empty store bounded by limits.
func NewStore(limits Limits) *Store {
	return &Store{limits: limits.withDefaults(), byID: map[string]*entry{}, order: list.New()}
}

// Incoming is one span to add, with its service and resource attributes and
// the bytes it counts for.
type Incoming struct {
	Span     Span
	Service  string
	Resource []KeyValue
	Bytes    int
}

// Add stores spans, evicting the oldest traces as needed.
func (s *Store) Add(spans []Incoming) {
	s.mu.Lock()
	kept := false
	for i := range spans {
		if s.addLocked(&spans[i]) {
			kept = true
		}
	}
	s.mu.Unlock()
	if kept {
		s.changed.Broadcast()
	}
}

func (s *Store) addLocked(in *Incoming) bool {
	if in.Bytes > s.limits.MaxBytes {
		s.dropped++
		return false
	}
	e := s.byID[in.Span.TraceID]
	if e != nil && e.seen[in.Span.SpanID] {
		return false
	}
	if e == nil {
		e = &entry{id: in.Span.TraceID, seen: map[string]bool{}, procs: map[string]string{}, process: map[string]Process{}}
		s.byID[e.id] = e
		e.elem = s.order.PushBack(e)
	}
	sp := in.Span
	pid, ok := e.procs[in.Service]
	if !ok {
		pid = "p" + strconv.Itoa(len(e.procs)+1)
		e.procs[in.Service] = pid
		e.process[pid] = Process{ServiceName: in.Service, Tags: in.Resource}
	}
	sp.ProcessID = pid
	e.spans = append(e.spans, sp)
	e.seen[sp.SpanID] = true
	e.bytes += in.Bytes
	s.bytes += in.Bytes
	for s.order.Len() > s.limits.MaxTraces || s.bytes > s.limits.MaxBytes {
		s.evictLocked(s.order.Front().Value.(*entry))
	}
	return s.byID[sp.TraceID] != nil
}

func (s *Store) evictLocked(e *entry) {
	s.order.Remove(e.elem)
	delete(s.byID, e.id)
	s.bytes -= e.bytes
	s.dropped += uint64(len(e.spans))
}

// Get returns a copy of the trace with id (32 hex digits), spans in start
// order.
func (s *Store) Get(id string) (*Trace, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.byID[id]
	if e == nil {
		return nil, false
	}
	t := &Trace{TraceID: e.id, Spans: append([]Span(nil), e.spans...), Processes: make(map[string]Process, len(e.process))}
	for k, v := range e.process {
		t.Processes[k] = v
	}
	sortSpans(t.Spans)
	return t, true
}

// Recent returns up to n trace summaries, the latest to arrive first.
func (s *Store) Recent(n int) []Summary {
	out, _ := s.Find(Filter{}, n)
	return out
}

// Find returns up to n summaries of the traces that pass f, the latest to
// arrive first, and how many of the kept traces pass it in all.
func (s *Store) Find(f Filter, n int) ([]Summary, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Summary
	// Without a filter every trace passes: only the n listed need a
	// summary.
	all := f.IsZero()
	matched := 0
	if all {
		matched = s.order.Len()
	}
	for el := s.order.Back(); el != nil && (!all || len(out) < n); el = el.Prev() {
		e := el.Value.(*entry)
		// A view of the entry, read under the lock: Summarize and the
		// filter only read it.
		t := &Trace{TraceID: e.id, Spans: e.spans, Processes: e.process}
		sum := Summarize(t)
		if all || f.matchSummary(sum) && f.matchSpans(t) {
			if !all {
				matched++
			}
			if len(out) < n {
				out = append(out, sum)
			}
		}
	}
	return out, matched
}

// Names returns the service names and the operation names of the kept
// spans, each sorted, at most limit operations.
func (s *Store) Names(limit int) (services, operations []string) {
	s.mu.Lock()
	svc, ops := map[string]bool{}, map[string]bool{}
	for el := s.order.Front(); el != nil; el = el.Next() {
		e := el.Value.(*entry)
		for _, p := range e.process {
			svc[p.ServiceName] = true
		}
		for i := range e.spans {
			if len(ops) < limit {
				ops[e.spans[i].OperationName] = true
			}
		}
	}
	s.mu.Unlock()
	return sortedKeys(svc), sortedKeys(ops)
}

// Stats reports the store's use.
type Stats struct {
	Traces, Bytes int
	Dropped       uint64
}

// Stats returns what the store holds now.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Traces: s.order.Len(), Bytes: s.bytes, Dropped: s.dropped}
}

// Changed returns a channel closed when the store next keeps a span.
func (s *Store) Changed() <-chan struct{} { return s.changed.C() }
