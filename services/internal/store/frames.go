package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
)

// nextFrame returns the offset of the first valid frame in b at or after
// from, or -1. Runs of zeros, the padding, are passed over quickly: a
// frame's length is never zero, so a frame starts at most 3 bytes before a
// non-zero byte.
func nextFrame(b []byte, from int) int {
	for p := from; p+frameHeader < len(b); p++ {
		q := nextNonZero(b, p)
		if q < 0 {
			return -1
		}
		p = max(p, q-3)
		if frameAt(b, p) {
			return p
		}
	}
	return -1
}

// frameAt reports whether a whole, valid frame of a non-empty payload
// starts at offset p of b: both checksums hold.
func frameAt(b []byte, p int) bool {
	rest := b[p:]
	if len(rest) <= frameHeader {
		return false
	}
	n := binary.LittleEndian.Uint32(rest[0:])
	if n == 0 || n > maxRecord || uint64(len(rest)-frameHeader) < uint64(n) {
		return false
	}
	if crc32.Checksum(rest[:8], castagnoli) != binary.LittleEndian.Uint32(rest[8:]) {
		return false
	}
	return crc32.Checksum(rest[frameHeader:frameHeader+int(n)], castagnoli) == binary.LittleEndian.Uint32(rest[4:])
}

// nextNonZero returns the offset of the first non-zero byte of b at or
// after from, or -1.
func nextNonZero(b []byte, from int) int {
	for from < len(b) {
		chunk := b[from:min(len(b), from+len(zeros))]
		if !bytes.Equal(chunk, zeros[:len(chunk)]) {
			for i, c := range chunk {
				if c != 0 {
					return from + i
				}
			}
		}
		from += len(chunk)
	}
	return -1
}

// span is a run of bytes of a journal where a record was due and none
// could be read: damage, with valid frames after it or none.
type span struct {
	from, to int
	// records is how many records it held, when that is known: one
	// damaged record whose header survived and ends where the next
	// valid frame starts. Zero: not known.
	records int
	err     error // why, wrapping ErrCorrupt
}

// resync splits b into its valid frames (splitFramesAt), but does not
// stop at damage: it names the damaged bytes as a span and goes on from
// the next valid frame (nextFrame), so that every valid record of a
// damaged journal is found. torn says that b ends in a torn write (not
// damage: nothing valid follows it), which is no span.
//
// What looks torn (zeros where a record should be, a checksum that fails
// over a sector of zeros, a frame cut short) is a torn write only when no
// valid frame follows it anywhere in the file: a write cut by a crash is
// the last one, so a record after it was acknowledged while the one before
// it was intact. Zeros inside an early record with intact ones after it are
// damage (a disk, a person, an attacker), and dropping it with everything
// after it without a word would lose acknowledged changes silently. The
// padding after the records is zeros and holds no frame, so the search
// passes over it.
//
// A valid frame is never found inside another record: both its checksums
// must hold, and its length's high byte is zero (maxRecord), a byte that
// no record's JSON holds (encoding/json escapes control characters).
func resync(b []byte) (frames []frame, spans []span, torn bool) {
	pos := 0
	for {
		fs, good, t, err := splitFramesAt(b, pos)
		frames = append(frames, fs...)
		if err == nil && !t {
			return frames, spans, false
		}
		at := nextFrame(b, good+1)
		if at < 0 {
			if err == nil {
				return frames, spans, true
			}
			return frames, append(spans, span{from: good, to: damagedEnd(b, good), err: err}), false
		}
		if err == nil {
			err = fmt.Errorf("%w: a damaged or zeroed record at offset %d with a valid record after it at offset %d (a torn write is only ever the last)",
				ErrCorrupt, good, at)
		}
		spans = append(spans, span{from: good, to: at, records: oneRecord(b, good, at), err: err})
		pos = at
	}
}

// oneRecord returns 1 when the bytes of b from off to next are one record
// whose header survived (its checksum holds), else 0.
func oneRecord(b []byte, off, next int) int {
	if next-off < frameHeader || crc32.Checksum(b[off:off+8], castagnoli) != binary.LittleEndian.Uint32(b[off+8:]) {
		return 0
	}
	if off+frameHeader+int(binary.LittleEndian.Uint32(b[off:])) != next {
		return 0
	}
	return 1
}

// damagedEnd returns where damage at off that no valid frame follows
// ends: the end of its record when its header survived, else the end of
// the last non-zero byte (the padding after it is zeros).
func damagedEnd(b []byte, off int) int {
	if len(b)-off >= frameHeader && crc32.Checksum(b[off:off+8], castagnoli) == binary.LittleEndian.Uint32(b[off+8:]) {
		if end := off + frameHeader + int(binary.LittleEndian.Uint32(b[off:])); end <= len(b) {
			return end
		}
	}
	end := len(b)
	for end > off && b[end-1] == 0 {
		end--
	}
	return end
}

// scannedJournal is a journal file read and checked.
type scannedJournal struct {
	journalFile
	data    []byte  // the file's bytes
	start   int     // where the records start: past the header
	records []frame // the valid frames after the header
	spans   []span  // the damage between and after them, in order
	torn    bool    // a torn write follows the last of them
	// err says the file cannot be used at all (unreadable, no header, a
	// foreign header): no record of it is replayed. Wraps ErrCorrupt.
	err error
}

// damage returns the first damage found in sj, or nil.
func (sj *scannedJournal) damage() error {
	if sj.err != nil {
		return sj.err
	}
	if len(sj.spans) > 0 {
		return fmt.Errorf("%s: %w", sj.path, sj.spans[0].err)
	}
	return nil
}

// scanJournal reads journal file jf, not following a symlink, and finds
// its valid records, past any damage (resync). A journal whose header is
// damaged is still read: the span from offset 0 covers the header, and
// the records after it are this file's (its name gives its number).
func scanJournal(jf journalFile) scannedJournal {
	sj := scannedJournal{journalFile: jf}
	b, err := readRegular(jf.path)
	if err != nil {
		sj.err = err
		return sj
	}
	if b == nil {
		sj.err = fmt.Errorf("%w: %s disappeared while being read", ErrCorrupt, jf.path)
		return sj
	}
	sj.data = b
	frames, spans, torn := resync(b)
	if len(frames) == 0 {
		err = fmt.Errorf("%w: %s has no header (%d bytes)", ErrCorrupt, jf.path, len(b))
		if len(spans) > 0 {
			err = fmt.Errorf("%s: %w", jf.path, spans[0].err)
		}
		sj.err = err
		return sj
	}
	sj.spans, sj.torn, sj.records = spans, torn, frames
	if frames[0].off != 0 {
		return sj // the header is in the first span
	}
	var h journalHeader
	dec := json.NewDecoder(bytes.NewReader(frames[0].payload))
	dec.DisallowUnknownFields()
	if herr := dec.Decode(&h); herr != nil || h.Journal != jf.num {
		sj.err = fmt.Errorf("%w: %s has a foreign header %.64q", ErrCorrupt, jf.path, frames[0].payload)
		sj.records, sj.spans = nil, nil
		return sj
	}
	sj.records, sj.start = frames[1:], frames[0].end()
	return sj
}
