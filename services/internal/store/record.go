// This file is the journal's format. A journal file is a sequence of
// frames:
//
//	length   uint32, little endian: the payload's length
//	crc      uint32: CRC-32C of the payload
//	hcrc     uint32: CRC-32C of length and crc
//	payload  length bytes of JSON
//
// The first frame is the file's header, {"journal":N}, N the number in the
// file's name; every later frame is one change, a Batch. A file is created
// whole with its header (temporary file, fsync, rename), so a journal
// without a valid header was damaged.
//
// A journal is preallocated: created with zeros after its header (see
// preallocation), so that a record written over them changes no metadata
// and its fdatasync needs no commit of the filesystem's journal. A frame
// header of zeros ends the records; zeros to the end of the file are
// that padding. Journals of older releases, with no padding, read the
// same.
//
// The header checksum tells a damaged length from a record cut short: a
// frame that ends past the end of the file, or a header cut short, is a
// torn write (the record was never acknowledged). In the padding a crash
// can leave any subset of a write's sectors on disk, so a frame that
// fails a checksum is a torn write too when a part of it that falls in
// one 512-byte sector is all zeros, or anything non-zero follows a zero
// header: the padding never written over, which no record of JSON or
// intact header holds. A frame that is all there, with no such zeros, and
// fails a checksum is damage. So is any of those followed, anywhere later
// in the file, by a valid frame: a torn write is only ever the last thing
// in the file (see resync).

package store

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/internal/atomicfile"
)

const (
	frameHeader = 12
	// maxRecord bounds one record: far above any real one, it keeps a
	// damaged length from asking for gigabytes.
	maxRecord = 64 << 20
	// journalInfix joins the snapshot's name and a journal's number.
	journalInfix = layout.CheckpointJournalInfix
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// appendFrame appends payload, framed, to dst.
func appendFrame(dst, payload []byte) []byte {
	var h [frameHeader]byte
	binary.LittleEndian.PutUint32(h[0:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[4:], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint32(h[8:], crc32.Checksum(h[:8], castagnoli))
	dst = append(dst, h[:]...)
	return append(dst, payload...)
}

// frame is a valid frame of a journal: its payload and the offset where
// it starts.
type frame struct {
	off     int
	payload []byte
}

// end is the offset just past f.
func (f frame) end() int { return f.off + frameHeader + len(f.payload) }

// splitFramesAt splits b, from offset good, into its valid frames. good
// is then the length of the valid frames; torn says that what follows them
// looks like a torn write (resync then checks that nothing valid follows);
// err (wrapping ErrCorrupt) says a frame that is all there is damaged, at
// offset good. Offsets, and the sectors a torn write is judged by, stay
// those of b.
func splitFramesAt(b []byte, good int) (frames []frame, _ int, torn bool, err error) {
	for good < len(b) {
		rest := b[good:]
		if allZero(rest[:min(len(rest), frameHeader)]) {
			// The padding: the end of the records, unless a write torn
			// by a crash left some of its sectors past here.
			return frames, good, !allZero(rest), nil
		}
		if len(rest) < frameHeader {
			return frames, good, true, nil
		}
		n := binary.LittleEndian.Uint32(rest[0:])
		if crc32.Checksum(rest[:8], castagnoli) != binary.LittleEndian.Uint32(rest[8:]) {
			if tornSector(b, good, frameHeader) {
				return frames, good, true, nil
			}
			return frames, good, false, fmt.Errorf("%w: damaged record header at offset %d", ErrCorrupt, good)
		}
		if n > maxRecord {
			return frames, good, false, fmt.Errorf("%w: record of %d bytes at offset %d", ErrCorrupt, n, good)
		}
		if len(rest) < frameHeader+int(n) {
			return frames, good, true, nil
		}
		payload := rest[frameHeader : frameHeader+int(n)]
		if crc32.Checksum(payload, castagnoli) != binary.LittleEndian.Uint32(rest[4:]) {
			// The header is intact (its checksum held), so only the
			// payload can hold a sector that was never written: a
			// header's own bytes may be zeros (a length's low byte).
			if tornSector(b, good+frameHeader, int(n)) {
				return frames, good, true, nil
			}
			return frames, good, false, fmt.Errorf("%w: record checksum mismatch at offset %d", ErrCorrupt, good)
		}
		frames = append(frames, frame{off: good, payload: payload})
		good += frameHeader + int(n)
	}
	return frames, good, false, nil
}

// sectorSize is the unit a disk writes whole: a write torn by a crash
// leaves each sector old or new.
const sectorSize = 512

// tornSector reports whether the frame of n bytes at off in b has a part,
// within one sector, that is all zeros: a sector of the padding that a
// crash kept from being written over.
func tornSector(b []byte, off, n int) bool {
	end := min(off+n, len(b))
	for off < end {
		next := min((off/sectorSize+1)*sectorSize, end)
		if allZero(b[off:next]) {
			return true
		}
		off = next
	}
	return false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// journalHeader is a journal file's first frame.
type journalHeader struct {
	Journal uint64 `json:"journal"`
}

// record is one change as the journal holds it.
type record struct {
	Resources          []json.RawMessage `json:"resources,omitempty"`
	RemovedResources   []string          `json:"removed_resources,omitempty"`
	Allocations        []json.RawMessage `json:"allocations,omitempty"`
	RemovedAllocations []AllocationKey   `json:"removed_allocations,omitempty"`
	Claims             []json.RawMessage `json:"claims,omitempty"`
	RemovedClaims      []string          `json:"removed_claims,omitempty"`
}

// encodedBatch is a Batch encoded: each put record on its own, as the
// state keeps it, and the journal record joining them.
type encodedBatch struct {
	b           *Batch
	resources   [][]byte
	allocations [][]byte // each within payload
	claims      [][]byte
	payload     []byte
}

func encodeBatch(b *Batch) (*encodedBatch, error) {
	e := &encodedBatch{b: b, resources: make([][]byte, len(b.Resources)), allocations: make([][]byte, len(b.Allocations))}
	n := 64
	var err error
	for i := range b.Resources {
		enc, err := json.Marshal(&b.Resources[i])
		if err != nil {
			return nil, fmt.Errorf("encode resource %s: %w", b.Resources[i].Name, err)
		}
		e.resources[i] = enc
		n += len(enc) + 1
	}
	for i := range b.Allocations {
		n += allocationSize(&b.Allocations[i])
	}
	for i := range b.RemovedAllocations {
		n += keySize(&b.RemovedAllocations[i])
	}
	p := make([]byte, 0, n)
	p = append(p, '{')
	sep := func() {
		if len(p) > 1 {
			p = append(p, ',')
		}
	}
	if len(e.resources) > 0 {
		p = append(p, `"resources":[`...)
		p = appendJoined(p, e.resources)
		p = append(p, ']')
	}
	if len(b.RemovedResources) > 0 {
		sep()
		names, err := json.Marshal(b.RemovedResources)
		if err != nil {
			return nil, err
		}
		p = append(p, `"removed_resources":`...)
		p = append(p, names...)
	}
	// Each allocation is encoded into the payload, and the state keeps
	// its part of it.
	var ends []int
	if len(b.Allocations) > 0 {
		sep()
		p = append(p, `"allocations":[`...)
		ends = make([]int, 0, 2*len(b.Allocations))
		for i := range b.Allocations {
			if i > 0 {
				p = append(p, ',')
			}
			start := len(p)
			if p, err = appendAllocation(p, &b.Allocations[i]); err != nil {
				return nil, fmt.Errorf("encode allocation %v: %w", b.Allocations[i].Key(), err)
			}
			ends = append(ends, start, len(p))
		}
		p = append(p, ']')
	}
	if len(b.RemovedAllocations) > 0 {
		sep()
		p = append(p, `"removed_allocations":[`...)
		for i := range b.RemovedAllocations {
			if i > 0 {
				p = append(p, ',')
			}
			if p, err = appendKey(p, &b.RemovedAllocations[i]); err != nil {
				return nil, err
			}
		}
		p = append(p, ']')
	}
	if e.claims, err = encodeClaims(b); err != nil {
		return nil, err
	}
	if p, err = appendClaims(p, e.claims, b.RemovedClaims); err != nil {
		return nil, err
	}
	e.payload = append(p, '}')
	for i := range e.allocations {
		e.allocations[i] = e.payload[ends[2*i]:ends[2*i+1]:ends[2*i+1]]
	}
	return e, nil
}

// The encoding of allocations and their keys, the records of every
// Allocate and Release: byte for byte what encoding/json writes for
// Allocation and AllocationKey (TestAppendAllocationIsJSON), written
// directly. A record with a string that JSON escapes, or a time that
// RFC 3339 cannot hold, is left to encoding/json.

// allocationSize is about the length of a's encoding.
func allocationSize(a *Allocation) int {
	n := 160 + len(a.PodUID) + len(a.PodNamespace) + len(a.PodName) + len(a.ContainerName) + len(a.ResourceName) +
		base64.StdEncoding.EncodedLen(len(a.Response)) + len(a.TraceID) + len(a.ContainerKind)
	for _, id := range a.DeviceIDs {
		n += len(id) + 3
	}
	return n
}

func keySize(k *AllocationKey) int {
	return 64 + len(k.PodUID) + len(k.ContainerName) + len(k.ResourceName)
}

// appendAllocation appends the JSON encoding of a to dst.
func appendAllocation(dst []byte, a *Allocation) ([]byte, error) {
	if !plain(a.PodUID) || !plain(a.PodNamespace) || !plain(a.PodName) || !plain(a.ContainerName) ||
		!plain(a.ResourceName) || !plain(a.TraceID) || !plain(a.ContainerKind) || slices.IndexFunc(a.DeviceIDs, func(id string) bool { return !plain(id) }) >= 0 {
		return appendMarshal(dst, a)
	}
	start := len(dst)
	dst = appendField(dst, `{"pod_uid":"`, a.PodUID)
	if a.PodNamespace != "" {
		dst = appendField(dst, `,"pod_namespace":"`, a.PodNamespace)
	}
	if a.PodName != "" {
		dst = appendField(dst, `,"pod_name":"`, a.PodName)
	}
	dst = appendField(dst, `,"container_name":"`, a.ContainerName)
	dst = appendField(dst, `,"resource_name":"`, a.ResourceName)
	dst = append(dst, `,"device_ids":`...)
	if a.DeviceIDs == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '[')
		for i, id := range a.DeviceIDs {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(dst, '"')
			dst = append(dst, id...)
			dst = append(dst, '"')
		}
		dst = append(dst, ']')
	}
	dst = append(dst, `,"response":`...)
	if a.Response == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, a.Response)
		dst = append(dst, '"')
	}
	if a.TraceID != "" {
		dst = appendField(dst, `,"trace_id":"`, a.TraceID)
	}
	dst = append(dst, `,"allocated":"`...)
	t0 := len(dst)
	dst = a.Allocated.AppendFormat(dst, time.RFC3339Nano)
	if !strictRFC3339(dst[t0:]) {
		return appendMarshal(dst[:start], a)
	}
	dst = append(dst, '"')
	if a.ContainerKind != "" {
		dst = appendField(dst, `,"container_kind":"`, a.ContainerKind)
	}
	return append(dst, '}'), nil
}

// appendKey appends the JSON encoding of k to dst.
func appendKey(dst []byte, k *AllocationKey) ([]byte, error) {
	if !plain(k.PodUID) || !plain(k.ContainerName) || !plain(k.ResourceName) {
		return appendMarshal(dst, k)
	}
	dst = appendField(dst, `{"pod_uid":"`, k.PodUID)
	dst = appendField(dst, `,"container_name":"`, k.ContainerName)
	dst = appendField(dst, `,"resource_name":"`, k.ResourceName)
	return append(dst, '}'), nil
}

func appendMarshal(dst []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// appendField appends name (which opens the string) and s, closed.
func appendField(dst []byte, name, s string) []byte {
	dst = append(dst, name...)
	dst = append(dst, s...)
	return append(dst, '"')
}

// plain reports whether encoding/json writes s as it is, between quotes:
// printable ASCII with nothing it escapes (quote, backslash, and <, >, &,
// which it escapes for HTML).
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// strictRFC3339 reports whether b, a time in RFC3339Nano, is what
// time.Time.MarshalJSON writes rather than refuses: a four-digit year and
// a zone offset under 24 hours.
func strictRFC3339(b []byte) bool {
	if len(b) < len("2006-01-02T15:04:05Z") || b[4] != '-' {
		return false
	}
	if b[len(b)-1] == 'Z' {
		return true
	}
	c := b[len(b)-len("Z07:00")]
	hours := 10*int(b[len(b)-5]-'0') + int(b[len(b)-4]-'0')
	return (c == '+' || c == '-') && hours < 24
}

func appendJoined(dst []byte, parts [][]byte) []byte {
	for i, b := range parts {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, b...)
	}
	return dst
}

// journalPath is the path of journal number n beside the snapshot at
// path.
func journalPath(path string, n uint64) string {
	return fmt.Sprintf("%s%s%010d", path, journalInfix, n)
}

// journalFile is a journal found on disk.
type journalFile struct {
	path string
	num  uint64
}

// listJournals returns the journals beside the snapshot at path, by
// number. Moved-aside files and anything else not named as a journal are
// not listed.
func listJournals(path string) ([]journalFile, error) {
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	prefix := filepath.Base(path) + journalInfix
	var out []journalFile
	for _, e := range entries {
		digits, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || digits == "" || strings.Trim(digits, "0123456789") != "" {
			continue
		}
		n, err := strconv.ParseUint(digits, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, journalFile{path: filepath.Join(filepath.Dir(path), e.Name()), num: n})
	}
	slices.SortFunc(out, func(a, b journalFile) int {
		switch {
		case a.num < b.num:
			return -1
		case a.num > b.num:
			return 1
		}
		return 0
	})
	return out, nil
}

// createJournal creates journal number n beside the snapshot at path,
// whole with its header and prealloc bytes of padding in all (temporary
// file, fsync, rename, directory fsync), and returns it open for
// writing, with the length of its header: records are written from
// there, over the padding and then past it.
func createJournal(path string, n uint64, prealloc int64) (*os.File, int64, error) {
	f, err := atomicfile.CreateTemp(filepath.Dir(path), "."+FileName+".journal-tmp-")
	if err != nil {
		return nil, 0, fmt.Errorf("create journal: %w", err)
	}
	h, err := json.Marshal(journalHeader{Journal: n})
	if err != nil {
		atomicfile.Discard(f)
		return nil, 0, err
	}
	frame := appendFrame(nil, h)
	if _, err := f.Write(frame); err != nil {
		atomicfile.Discard(f)
		return nil, 0, fmt.Errorf("write journal header: %w", err)
	}
	if err := pad(f, prealloc-int64(len(frame))); err != nil {
		atomicfile.Discard(f)
		return nil, 0, fmt.Errorf("preallocate journal %s: %w", f.Name(), err)
	}
	if err := f.Sync(); err != nil {
		atomicfile.Discard(f)
		return nil, 0, fmt.Errorf("fsync journal %s: %w", f.Name(), err)
	}
	final := journalPath(path, n)
	if err := os.Rename(f.Name(), final); err != nil {
		atomicfile.Discard(f)
		return nil, 0, fmt.Errorf("rename journal into place: %w", err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(path)); err != nil {
		_ = f.Close()
		return nil, 0, err
	}
	return f, int64(len(frame)), nil
}

// zeros is written as a journal's padding.
var zeros = make([]byte, 64<<10)

// pad writes n zero bytes to f. They are written, not only allocated
// (fallocate would leave extents marked unwritten, whose first write
// changes metadata again).
func pad(f *os.File, n int64) error {
	for n > 0 {
		w, err := f.Write(zeros[:min(n, int64(len(zeros)))])
		if err != nil {
			return err
		}
		n -= int64(w)
	}
	return nil
}

// preallocation is the size of a new journal file: the size at which it
// is compacted (see Journal.maybeCompactLocked), with a quarter more for
// the records appended while the compaction starts, bounded. Records past
// it are appended, growing the file.
func preallocation(compactAt, snapSize int64) int64 {
	n := max(compactAt, snapSize)
	return min(n+n/4, maxPrealloc)
}

// maxPrealloc bounds a journal's padding.
const maxPrealloc = 64 << 20
