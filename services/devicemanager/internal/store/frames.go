package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
)

// scanFrames splits b into frame payloads, as splitFrames does, and tells a
// torn write from damage. good is the length of the valid frames; torn says
// that what follows them is a torn write; err (wrapping ErrCorrupt) says
// that the frame at offset good is damaged.
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
func scanFrames(b []byte) (payloads [][]byte, good int, torn bool, err error) {
	payloads, good, torn, err = splitFrames(b)
	if !torn {
		return payloads, good, torn, err
	}
	if at := nextFrame(b, good+1); at >= 0 {
		return payloads, good, false, fmt.Errorf("%w: a damaged or zeroed record at offset %d with a valid record after it at offset %d (a torn write is only ever the last)",
			ErrCorrupt, good, at)
	}
	return payloads, good, true, nil
}

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
