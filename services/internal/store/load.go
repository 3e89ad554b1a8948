package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nodeplug/nodeplug/services/internal/atomicfile"
)

// Load implements Store. It reads the snapshot, then the journals that
// continue it: a torn last record is dropped; a damaged snapshot is moved
// aside with its journals; a damaged journal is moved aside, and every
// valid record in it and in the journals after it is kept, the damage
// named (CorruptError.Gaps; see replay and gaps.go). It then
// writes a fresh snapshot with an empty journal (which also migrates an
// older-format checkpoint) and removes what that replaces.
//
// The phases: readSnapshot, sortJournals (with olderFormat, the migration
// of a version 1 checkpoint, apart from the recovery of version 2's),
// replay, and restart, each a method of loader.
func (j *Journal) Load() (*Data, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.loaded {
		return nil, errors.New("checkpoint store loaded twice")
	}
	j.loaded = true
	removeTemps(filepath.Dir(j.path))
	l := &loader{j: j, now: time.Now(), st: newState(), version: Version}
	if err := l.readSnapshot(); err != nil {
		return nil, err
	}
	replay, err := l.sortJournals()
	if err != nil {
		return nil, err
	}
	if err := l.replay(replay); err != nil {
		return nil, err
	}
	if err := l.restart(); err != nil {
		return nil, err
	}
	if !l.saved && l.st.empty() {
		return nil, errors.Join(l.problems...)
	}
	d, err := l.st.data()
	if err != nil {
		return nil, err
	}
	return d, errors.Join(l.problems...)
}

// loader is one Load's state, from phase to phase.
type loader struct {
	j   *Journal
	now time.Time // names what is moved aside
	st  *state
	// snapBytes is the snapshot as read (its size sizes the new journal).
	snapBytes []byte
	// first is the first journal that continues the snapshot.
	first   uint64
	version int
	// saved: a snapshot or a journal holds state, empty or not.
	saved    bool
	journals []journalFile
	highest  uint64 // the highest journal number found
	problems []error
	// recovered counts the journal records replayed; gaps are those
	// found, open the last (removals replayed after it are noted in it).
	recovered int
	gaps      []*Gap
	open      *Gap
}

// readSnapshot reads the snapshot and lists the journals beside it. A
// snapshot that cannot be trusted is moved aside with its journals, which
// mean nothing without it, and Load goes on with an empty state.
func (l *loader) readSnapshot() error {
	j := l.j
	b, err := readRegular(j.path)
	if err == nil && b != nil {
		var snap *snapshot
		if snap, err = unmarshalSnapshot(b); err == nil {
			l.st, l.first, l.version, l.saved = snap.state, snap.journal, snap.version, true
		}
	}
	l.snapBytes = b
	journals, lerr := listJournals(j.path)
	if lerr != nil {
		return fmt.Errorf("list journals in %s: %w", filepath.Dir(j.path), lerr)
	}
	for _, jf := range journals {
		l.highest = max(l.highest, jf.num)
	}
	l.journals = journals
	if err == nil {
		return nil
	}
	ce, merr := j.moveAside(j.path, err, l.now)
	if merr != nil {
		return merr
	}
	if err := l.moveAsideToo(ce, journals); err != nil {
		return err
	}
	l.problems = append(l.problems, ce)
	l.journals = nil
	return nil
}

// moveAsideToo moves journals aside because of the damage ce describes,
// and names them in ce.
func (l *loader) moveAsideToo(ce *CorruptError, journals []journalFile) error {
	for _, jf := range journals {
		aside, err := moveAside(jf.path, l.now)
		if err != nil {
			return fmt.Errorf("move journal %s aside: %w", jf.path, err)
		}
		ce.Also = append(ce.Also, aside)
	}
	return nil
}

// sortJournals decides what becomes of each journal: beside an
// older-format checkpoint, see olderFormat; beside a snapshot of this
// format, a journal it replaces (a compaction stopped before removing it)
// is removed, and the rest are scanned, to replay in order.
func (l *loader) sortJournals() ([]scannedJournal, error) {
	var replay []scannedJournal
	for _, jf := range l.journals {
		switch {
		case l.version == 1:
			if err := l.olderFormat(jf); err != nil {
				return nil, err
			}
		case l.saved && jf.num < l.first:
			if err := os.Remove(jf.path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return nil, fmt.Errorf("remove replaced journal: %w", err)
			}
		default:
			replay = append(replay, scanJournal(jf))
			l.saved = true
		}
	}
	return replay, nil
}

// olderFormat is the migration's part of sortJournals: a checkpoint of
// version 1 holds the whole state and has no journal. An empty journal
// beside it is the migration's own, made before a crash stopped it short
// of its snapshot replacing the older one: nothing to keep and nothing
// wrong, it is removed. Any other journal predates the checkpoint (an
// older release rewrote the whole state) and is moved aside as damage.
// restart then writes the state as a snapshot of this format.
func (l *loader) olderFormat(jf journalFile) error {
	if emptyJournal(jf) {
		if err := os.Remove(jf.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove empty journal: %w", err)
		}
		return nil
	}
	aside, err := moveAside(jf.path, l.now)
	if err != nil {
		return fmt.Errorf("move journal %s aside: %w", jf.path, err)
	}
	l.problems = append(l.problems, &CorruptError{Path: jf.path, MovedTo: aside,
		Err: fmt.Errorf("%w: a journal beside a checkpoint of the older format", ErrCorrupt)})
	return nil
}

// replay applies every valid record of the journals, in order. Damage is
// passed over (see resync): each span of a journal that holds no readable
// record, each record that does not apply, a torn write before the last
// record written (a later journal holds records) and a journal that
// cannot be used at all is a Gap; a journal with one is moved aside once
// read, with one CorruptError that lists its gaps, and the journals after
// it are replayed still. See gaps.go for what the state recovered means.
func (l *loader) replay(replay []scannedJournal) error {
	for i := range replay {
		sj := &replay[i]
		later := false
		for _, s := range replay[i+1:] {
			later = later || s.err != nil || len(s.records) > 0 || len(s.spans) > 0 || s.torn
		}
		gaps := l.replayJournal(sj, later)
		if len(gaps) == 0 {
			continue
		}
		why := fmt.Errorf("%w: %d unreadable span(s); the valid records around them were kept", ErrCorrupt, len(gaps))
		if gaps[0].Whole {
			why = gaps[0].Why
		}
		ce, err := l.j.moveAside(sj.path, why, l.now)
		if err != nil {
			return err
		}
		ce.Gaps = gaps
		l.problems = append(l.problems, ce)
	}
	for _, g := range l.gaps {
		g.After = l.recovered - g.After
	}
	return nil
}

// replayJournal applies the valid records of sj and returns its gaps. A
// torn write at its end is a gap when a later journal holds anything: a
// torn write is only ever the last thing written.
func (l *loader) replayJournal(sj *scannedJournal, later bool) []*Gap {
	if sj.err != nil {
		return []*Gap{l.gap(sj, span{to: len(sj.data), err: sj.err}, true)}
	}
	var gaps []*Gap
	spans, end := sj.spans, sj.start
	for _, r := range sj.records {
		for ; len(spans) > 0 && spans[0].from < r.off; spans = spans[1:] {
			gaps = append(gaps, l.gap(sj, spans[0], false))
		}
		end = r.end()
		u, err := l.st.replayNoting(r.payload)
		if err != nil {
			gaps = append(gaps, l.gap(sj, span{from: r.off, to: r.end(), records: 1,
				err: fmt.Errorf("a record at offset %d that does not apply: %w", r.off, err)}, false))
			continue
		}
		l.recovered++
		if l.open != nil {
			l.open.Unmatched.add(u)
		}
	}
	for _, s := range spans {
		gaps = append(gaps, l.gap(sj, s, false))
	}
	if sj.torn && later {
		gaps = append(gaps, l.gap(sj, span{from: end, to: damagedEnd(sj.data, end),
			err: fmt.Errorf("%w: a torn write at offset %d before the journal's end (a later journal holds records)", ErrCorrupt, end)}, false))
	}
	return gaps
}

// gap describes span s of sj as a Gap, which the removals replayed after
// it are then noted in.
func (l *loader) gap(sj *scannedJournal, s span, whole bool) *Gap {
	g := &Gap{Journal: sj.path, From: int64(s.from), To: int64(s.to), Whole: whole, Records: s.records, Why: s.err,
		Named: nameIn(sj.data[s.from:s.to]), After: l.recovered}
	l.gaps = append(l.gaps, g)
	l.open = g
	return g
}

// restart writes the state loaded as a fresh snapshot continued by a new,
// empty journal, removes the journals it replaces, and makes that journal
// the one appended to.
func (l *loader) restart() error {
	j := l.j
	next := max(l.highest, l.first) + 1
	f, size, err := createJournal(j.path, next, preallocation(j.opts.CompactAt, int64(len(l.snapBytes))))
	if err != nil {
		return err
	}
	snapSize, err := writeSnapshot(j.path, next, l.st)
	if err != nil {
		_ = f.Close()
		return err
	}
	if err := removeJournalsBefore(j.path, next); err != nil {
		_ = f.Close()
		return err
	}
	j.st, j.f, j.num, j.size, j.snapSize, j.numbers = l.st, f, next, size, snapSize, next
	return nil
}

// emptyJournal reports whether jf holds no record and nothing torn or
// damaged: as a new journal is created.
func emptyJournal(jf journalFile) bool {
	sj := scanJournal(jf)
	return sj.err == nil && !sj.torn && len(sj.records) == 0 && len(sj.spans) == 0
}

// moveAside moves a damaged file aside and describes it.
func (j *Journal) moveAside(path string, why error, now time.Time) (*CorruptError, error) {
	aside, err := moveAside(path, now)
	if err != nil {
		return nil, fmt.Errorf("%s is unusable (%v) and could not be moved aside: %w", path, why, err)
	}
	return &CorruptError{Path: path, MovedTo: aside, Err: why}, nil
}

// removeTemps removes temporary files a crash left behind.
func removeTemps(dir string) {
	atomicfile.RemoveTemps(dir, atomicfile.TempPrefix(Path(dir)), "."+FileName+".journal-tmp-")
}
