package store

import "fmt"

// The whole-file scans the tests check a journal's bytes with. Load reads
// journals with resync, which goes on past damage; these stop at it.

// splitFrames splits b into frame payloads. good is the length of the
// valid frames; torn says that what follows them looks like a torn write
// (scanFrames then checks that nothing valid follows); err (wrapping
// ErrCorrupt) says a frame that is all there is damaged, at offset good.
func splitFrames(b []byte) (payloads [][]byte, good int, torn bool, err error) {
	frames, good, torn, err := splitFramesAt(b, 0)
	for _, f := range frames {
		payloads = append(payloads, f.payload)
	}
	return payloads, good, torn, err
}

// scanFrames splits b into frame payloads, as splitFrames does, and tells a
// torn write from damage. good is the length of the valid frames; torn says
// that what follows them is a torn write; err (wrapping ErrCorrupt) says
// that the frame at offset good is damaged.
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
