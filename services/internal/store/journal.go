package store

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/services/internal/atomicfile"
)

// DefaultCompactAt is the journal size past which the snapshot is
// rewritten, unless the snapshot is larger: then the journal may grow to
// the snapshot's size first, so compaction costs at most as much as the
// appends it follows.
const DefaultCompactAt = 1 << 20

// ErrClosed is returned by a Store used after Flush.
var ErrClosed = errors.New("checkpoint store is closed")

// Options tunes a Journal.
type Options struct {
	// CompactAt is the journal size, in bytes, past which the snapshot is
	// rewritten in the background (or past the snapshot's own size, if
	// larger). Zero means DefaultCompactAt.
	CompactAt int64
	// Log receives compaction failures (nil: none are logged). A failed
	// compaction loses nothing, the journal only grows until one works,
	// but a person should hear of it (a full or read-only disk, say).
	Log *slog.Logger

	// hooks are the tests' seams (nil: none).
	hooks *journalHooks
}

// journalHooks are a Journal's seams for tests, given in Options.hooks.
type journalHooks struct {
	// crash, when set, is called at each step of a compaction; an error
	// stops the compaction there, as a crash would.
	crash func(step string) error
	// failWrite, when set, fails journal writes.
	failWrite func() error
	// syncs counts the journal syncs, compactions the snapshots written
	// by compaction.
	syncs, compactions atomic.Uint64
}

// compactFailureLogEvery is how often a compaction that keeps failing is
// logged again.
const compactFailureLogEvery = time.Minute

// Journal is the Store: a snapshot file and a journal of the changes
// since. See the package documentation.
type Journal struct {
	path  string
	opts  Options
	hooks *journalHooks // never nil: Options.hooks, or none set

	mu   sync.Mutex
	cond *sync.Cond
	st   *state

	f        *os.File // the journal appended to
	num      uint64   // its number
	size     int64    // its valid length
	buf      []byte   // frames appended, not yet written
	spare    []byte
	seq      Ticket // the last change appended
	durable  Ticket // the last change durable
	flushing bool   // a write and sync are in flight
	last     flushResult
	dirty    bool   // a write failed: the journal may hold a partial frame past size
	lost     bool   // the journal file was removed: the next write starts anew
	numbers  uint64 // the highest journal number handed out

	// snapMu orders snapshot writes: a compaction's, and a new start
	// after the journal was lost.
	snapMu sync.Mutex

	snapSize   int64
	compacting bool
	closed     bool
	loaded     bool
	wg         sync.WaitGroup

	// Compactions that failed in a row, and when that was last logged.
	compactFailures int
	compactLogged   time.Time
}

type flushResult struct {
	upto Ticket
	err  error
}

var _ Store = (*Journal)(nil)

// New returns the Store kept in dir: dir/nodeplug_checkpoint and its
// journal. dir must exist.
func New(dir string, opts Options) *Journal {
	if opts.CompactAt <= 0 {
		opts.CompactAt = DefaultCompactAt
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	hooks := opts.hooks
	if hooks == nil {
		hooks = &journalHooks{}
	}
	j := &Journal{path: Path(dir), opts: opts, hooks: hooks, st: newState()}
	j.cond = sync.NewCond(&j.mu)
	return j
}

// Location implements Store: the snapshot's path.
func (j *Journal) Location() string { return j.path }

// removeJournalsBefore removes the journals numbered below n, which the
// snapshot continued by n replaces.
func removeJournalsBefore(path string, n uint64) error {
	journals, err := listJournals(path)
	if err != nil {
		return err
	}
	removed := false
	for _, jf := range journals {
		if jf.num >= n {
			continue
		}
		if err := os.Remove(jf.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove replaced journal: %w", err)
		}
		removed = true
	}
	if removed {
		return atomicfile.SyncDir(filepath.Dir(path))
	}
	return nil
}

// Append implements Store.
func (j *Journal) Append(b Batch) (Ticket, error) {
	if b.Empty() {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.seq, nil
	}
	e, err := encodeBatch(&b)
	if err != nil {
		return 0, err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return 0, ErrClosed
	}
	j.st.apply(e)
	j.buf = appendFrame(j.buf, e.payload)
	j.seq++
	return j.seq, nil
}

// Wait implements Store. The first waiter that finds no write in flight
// writes and syncs every frame appended so far; waiters that arrive
// meanwhile wait for it and then share the next write.
func (j *Journal) Wait(t Ticket) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.durable < t {
		if !j.flushing {
			if j.f == nil {
				return ErrClosed
			}
			if r := j.flushLocked(); r.err != nil && r.upto >= t {
				return r.err
			}
			continue
		}
		for j.flushing {
			j.cond.Wait()
		}
		if r := j.last; r.err != nil && r.upto >= t && j.durable < t {
			return r.err
		}
	}
	return nil
}

// flushLocked writes the frames appended so far and syncs them. It
// releases j.mu while it writes.
func (j *Journal) flushLocked() flushResult {
	j.flushing = true
	data, upto, f, size, dirty, lost := j.buf, j.seq, j.f, j.size, j.dirty, j.lost
	j.buf = j.spare[:0]
	j.mu.Unlock()

	var err error
	if lost {
		err = j.restart()
		if err == nil {
			j.mu.Lock()
			f, size, dirty = j.f, j.size, false
			j.mu.Unlock()
		}
	}
	if err == nil && dirty {
		// A failed write may have left part of a frame past the valid
		// length: cut it off before writing again (and the padding
		// with it: later records are appended).
		err = f.Truncate(size)
	}
	if err == nil && j.hooks.failWrite != nil {
		err = j.hooks.failWrite()
	}
	if err == nil {
		// Over the padding, where there is some: no metadata changes.
		_, err = f.WriteAt(data, size)
	}
	if err == nil {
		err = syscall.Fdatasync(int(f.Fd()))
		j.hooks.syncs.Add(1)
	}
	if err == nil {
		// A journal removed while open takes writes that no restart
		// would read: say so, and start anew on the next write.
		var st syscall.Stat_t
		if err = syscall.Fstat(int(f.Fd()), &st); err == nil && st.Nlink == 0 {
			err = errors.New("the journal file was removed")
		}
	}

	j.mu.Lock()
	j.flushing = false
	if err != nil {
		err = fmt.Errorf("append to journal %s: %w", journalPath(j.path, j.num), err)
		// Keep the frames for the next write, before those appended
		// since.
		j.buf = append(data, j.buf...)
		j.dirty = true
		if !j.lost {
			var st syscall.Stat_t
			if serr := syscall.Fstat(int(f.Fd()), &st); serr == nil && st.Nlink == 0 {
				j.lost = true
			}
		}
	} else {
		j.spare = data[:0]
		if cap(j.spare) > 1<<20 {
			j.spare = nil
		}
		j.durable, j.size, j.dirty = upto, size+int64(len(data)), false
		j.maybeCompactLocked()
	}
	j.last = flushResult{upto: upto, err: err}
	j.cond.Broadcast()
	return j.last
}

// maybeCompactLocked starts a compaction when the journal has grown past
// its bound.
func (j *Journal) maybeCompactLocked() {
	if j.compacting || j.closed || j.size < max(j.opts.CompactAt, j.snapSize) {
		return
	}
	j.compacting = true
	j.wg.Add(1)
	go j.compact()
}

// compact rewrites the snapshot and starts a new journal:
//  1. create journal n+1, empty, beside the current one;
//  2. switch appends to it, and copy the state as of the switch;
//  3. write the snapshot of that state, continued by journal n+1;
//  4. remove journal n.
//
// A crash at any step leaves a valid pair: before 3, the old snapshot
// with journals n and n+1; after it, the new snapshot and journal n+1
// (which may repeat changes the snapshot holds: replaying them again
// changes nothing, as every record puts or removes a whole record).
func (j *Journal) compact() {
	defer j.wg.Done()
	ok := false
	var failed error
	defer func() {
		j.mu.Lock()
		j.compactedLocked(ok, failed)
		j.compacting = false
		j.mu.Unlock()
		if ok {
			j.hooks.compactions.Add(1)
		}
	}()
	j.mu.Lock()
	j.numbers++
	n, snapSize0 := j.numbers, j.snapSize
	j.mu.Unlock()
	if !j.step("start") {
		return
	}
	f, size, err := createJournal(j.path, n, preallocation(j.opts.CompactAt, snapSize0))
	if err != nil {
		failed = err
		return
	}
	if !j.step("created") {
		_ = f.Close()
		return
	}
	j.mu.Lock()
	for j.flushing {
		j.cond.Wait()
	}
	if j.closed || n <= j.num || j.dirty || j.lost {
		j.mu.Unlock()
		_ = f.Close()
		_ = os.Remove(journalPath(j.path, n))
		return
	}
	old := j.f
	j.f, j.num, j.size = f, n, size
	st := j.st.clone()
	j.mu.Unlock()
	_ = old.Close()
	if !j.step("switched") {
		return
	}
	j.snapMu.Lock()
	defer j.snapMu.Unlock()
	snapSize, err := writeSnapshot(j.path, n, st)
	if err != nil {
		failed = err
		return
	}
	if !j.step("snapshot") {
		return
	}
	if err := removeJournalsBefore(j.path, n); err != nil {
		failed = err
		return
	}
	j.mu.Lock()
	j.snapSize = snapSize
	j.mu.Unlock()
	ok = true
}

// compactedLocked logs how a compaction ended: a failure at once, then again
// at most every compactFailureLogEvery while they go on, and the first
// success after failures. A compaction that failed is retried after the
// next write.
func (j *Journal) compactedLocked(ok bool, err error) {
	switch {
	case ok && j.compactFailures > 0:
		j.opts.Log.Info("checkpoint compaction works again", "path", j.path, "failures", j.compactFailures)
		j.compactFailures = 0
	case err != nil:
		j.compactFailures++
		if now := time.Now(); j.compactFailures == 1 || now.Sub(j.compactLogged) >= compactFailureLogEvery {
			j.compactLogged = now
			j.opts.Log.Error("checkpoint compaction failed: the journal grows until one succeeds (nothing is lost)",
				"path", j.path, "failures", j.compactFailures, "error", err)
		}
	}
}

// restart starts a new journal, with a snapshot of the whole state, after
// the current journal file was removed. The caller is the writer
// (j.flushing is set) and does not hold j.mu.
func (j *Journal) restart() error {
	j.snapMu.Lock()
	defer j.snapMu.Unlock()
	j.mu.Lock()
	j.numbers++
	n, snapSize0 := j.numbers, j.snapSize
	j.mu.Unlock()
	f, size, err := createJournal(j.path, n, preallocation(j.opts.CompactAt, snapSize0))
	if err != nil {
		return err
	}
	j.mu.Lock()
	// Every change appended so far is in this state; the frames waiting
	// to be written go to the new journal after it, which changes
	// nothing when replayed.
	st := j.st.clone()
	old := j.f
	j.f, j.num, j.size, j.lost, j.dirty = f, n, size, false, false
	j.mu.Unlock()
	_ = old.Close()
	snapSize, err := writeSnapshot(j.path, n, st)
	if err != nil {
		j.mu.Lock()
		j.lost = true // the new journal continues no snapshot: start anew again
		j.mu.Unlock()
		return err
	}
	if err := removeJournalsBefore(j.path, n); err != nil {
		return err
	}
	j.mu.Lock()
	j.snapSize = snapSize
	j.mu.Unlock()
	return nil
}

// step reports whether a compaction goes on past step (tests stop it).
func (j *Journal) step(name string) bool {
	return j.hooks.crash == nil || j.hooks.crash(name) == nil
}

// Flush implements Store.
func (j *Journal) Flush() error {
	j.mu.Lock()
	j.closed = true
	t, f := j.seq, j.f
	j.mu.Unlock()
	j.wg.Wait() // a compaction in flight stops or ends
	if f == nil {
		return nil
	}
	err := j.Wait(t)
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f != nil {
		if cerr := j.f.Close(); err == nil {
			err = cerr
		}
		j.f = nil
	}
	return err
}

// Size returns the current journal's length in bytes and the last
// snapshot's, for the bench and tests.
func (j *Journal) Size() (journal, snapshot int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.size, j.snapSize
}

// ReadState reads the state saved in dir, snapshot and journals, as Load
// would restore it, without changing any file: for tests and tools. A
// torn last record is ignored; damage is an error wrapping ErrCorrupt.
func ReadState(dir string) (*Data, error) {
	path := Path(dir)
	st, first := newState(), uint64(0)
	b, err := readRegular(path)
	if err != nil {
		return nil, err
	}
	if b != nil {
		snap, err := unmarshalSnapshot(b)
		if err != nil {
			return nil, err
		}
		st, first = snap.state, snap.journal
	}
	journals, err := listJournals(path)
	if err != nil {
		return nil, err
	}
	for _, jf := range journals {
		if b != nil && jf.num < first {
			continue
		}
		sj := scanJournal(jf)
		if err := sj.damage(); err != nil {
			return nil, err
		}
		for _, r := range sj.records {
			if err := st.replay(r.payload); err != nil {
				return nil, err
			}
		}
	}
	if b == nil && len(journals) == 0 {
		return nil, nil
	}
	return st.data()
}
