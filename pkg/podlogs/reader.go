package podlogs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// The CRI log format, one record a line:
//
//	<time> <stream> <tag> <content>
//
// time is RFC 3339 with nanoseconds (podman writes
// 2026-01-02T15:04:05.123456789+00:00, CRI-O and containerd a Z); stream
// is stdout or stderr; tag is F for the end of a line of the container's
// output or P for a part of a longer one (the runtime cuts lines at its
// buffer's size, 8 KiB in podman's conmon, and writes what it holds when
// the container exits without a final newline); content is the output
// itself, without its newline. The CRI allows more tags after the first,
// separated by colons; only the first is read. One space separates the
// fields, and content keeps any spaces it begins with.
//
// The Reader also reads the log docker's json-file driver writes (which
// the kubelet's dockershim linked into the same layout), one JSON object
// a line:
//
//	{"log":"<content>\n","stream":"stdout","time":"<RFC 3339 time>"}
//
// where a log without its final newline is a part of a longer line
// (docker cuts lines at 16 KiB), as a P record is. Each line is read as
// what it begins with: a "{" is docker's, anything else a CRI record.

// The streams a record names.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// ErrMalformed is wrapped by the error about a line in neither the CRI
// log format nor docker's; that error names the line's number (from 1).
var ErrMalformed = errors.New("not a CRI log line")

// Entry is one line of a container's output: its parts joined when the
// runtime wrote it as partial records.
type Entry struct {
	// Time is when the runtime received the line's first part.
	Time time.Time
	// Stream is Stdout or Stderr.
	Stream string
	// Content is the line without its newline.
	Content []byte
}

// Reader reads the lines of a CRI log: each F record, joined with the P
// records of the same stream before it. The two streams' lines are given
// in the order they were completed.
//
// A last record with no newline is a write still in progress and is left
// out. Parts of a line still waiting for their F at the end of the input
// (the container exited without a final newline) are given as a line
// of their own, after the complete lines.
//
// A Reader holds a line's parts in memory until its F, however long the
// line is: the runtime's records are short, but it is the container that
// decides how long a line is.
type Reader struct {
	br      *bufio.Reader
	line    int    // the number of the last line read
	buf     []byte // the line being read
	pending []*Entry
	done    bool // the input is exhausted; pending is being drained
}

// NewReader reads the CRI log in r.
func NewReader(r io.Reader) *Reader {
	return &Reader{br: bufio.NewReaderSize(r, 64<<10)}
}

// Next is the next line of the log, or io.EOF after the last. A line not
// in the CRI log format is an error wrapping ErrMalformed that names the
// line's number. An error of the underlying reader is returned as it is.
func (r *Reader) Next() (Entry, error) {
	for !r.done {
		line, err := r.readLine()
		if errors.Is(err, io.EOF) {
			r.done = true
			break
		}
		if err != nil {
			return Entry{}, err
		}
		e, ok, err := r.add(line)
		if err != nil {
			return Entry{}, fmt.Errorf("line %d: %w", r.line, err)
		}
		if ok {
			return e, nil
		}
	}
	if len(r.pending) == 0 {
		return Entry{}, io.EOF
	}
	e := r.pending[0]
	r.pending = r.pending[1:]
	return *e, nil
}

// readLine reads one whole line, its newline included, however long it
// is. It returns io.EOF at the end of the input, dropping a last line
// that has no newline.
func (r *Reader) readLine() ([]byte, error) {
	r.buf = r.buf[:0]
	for {
		chunk, err := r.br.ReadSlice('\n')
		r.buf = append(r.buf, chunk...)
		switch {
		case err == nil:
			r.line++
			return r.buf, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// add takes one record. When it ends a line, that line is returned with
// ok set.
func (r *Reader) add(line []byte) (e Entry, ok bool, err error) {
	t, stream, partial, content, err := parseRecord(line)
	if err != nil {
		return Entry{}, false, err
	}
	i := r.pendingIndex(stream)
	if i < 0 {
		if !partial {
			return Entry{Time: t, Stream: stream, Content: bytes.Clone(content)}, true, nil
		}
		r.pending = append(r.pending, &Entry{Time: t, Stream: stream, Content: bytes.Clone(content)})
		return Entry{}, false, nil
	}
	p := r.pending[i]
	p.Content = append(p.Content, content...)
	if partial {
		return Entry{}, false, nil
	}
	r.pending = append(r.pending[:i], r.pending[i+1:]...)
	return *p, true, nil
}

// pendingIndex is the index in pending of the stream's unfinished line,
// or -1.
func (r *Reader) pendingIndex(stream string) int {
	for i, p := range r.pending {
		if p.Stream == stream {
			return i
		}
	}
	return -1
}

// parseRecord splits one record, its newline included, into its fields.
// The content returned shares line's memory.
func parseRecord(line []byte) (t time.Time, stream string, partial bool, content []byte, err error) {
	line = bytes.TrimSuffix(line, []byte("\n"))
	if len(line) > 0 && line[0] == '{' {
		return parseDockerRecord(line)
	}
	ts, rest, ok := bytes.Cut(line, []byte(" "))
	if !ok {
		return t, "", false, nil, fmt.Errorf("%w: no stream after the time %q", ErrMalformed, clip(ts))
	}
	t, err = time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return t, "", false, nil, fmt.Errorf("%w: the time %q is not RFC 3339", ErrMalformed, clip(ts))
	}
	s, rest, ok := bytes.Cut(rest, []byte(" "))
	switch string(s) {
	case Stdout, Stderr:
		stream = string(s)
	default:
		return t, "", false, nil, fmt.Errorf("%w: stream %q is neither stdout nor stderr", ErrMalformed, clip(s))
	}
	if !ok {
		return t, "", false, nil, fmt.Errorf("%w: no tag after the stream", ErrMalformed)
	}
	tags, content, _ := bytes.Cut(rest, []byte(" "))
	first, _, _ := bytes.Cut(tags, []byte(":"))
	switch string(first) {
	case "P":
		partial = true
	case "F":
	default:
		return t, "", false, nil, fmt.Errorf("%w: tag %q is neither P nor F", ErrMalformed, clip(tags))
	}
	return t, stream, partial, content, nil
}

// dockerRecord is a line of docker's json-file log.
type dockerRecord struct {
	Log    string `json:"log"`
	Stream string `json:"stream"`
	Time   string `json:"time"`
}

// parseDockerRecord reads a line of docker's json-file log, without its
// newline.
func parseDockerRecord(line []byte) (t time.Time, stream string, partial bool, content []byte, err error) {
	var r dockerRecord
	if err := json.Unmarshal(line, &r); err != nil {
		return t, "", false, nil, fmt.Errorf("%w: a line beginning with { that is not docker's JSON: %v", ErrMalformed, err)
	}
	t, err = time.Parse(time.RFC3339Nano, r.Time)
	if err != nil {
		return t, "", false, nil, fmt.Errorf("%w: the time %q is not RFC 3339", ErrMalformed, clip([]byte(r.Time)))
	}
	switch r.Stream {
	case Stdout, Stderr:
	default:
		return t, "", false, nil, fmt.Errorf("%w: stream %q is neither stdout nor stderr", ErrMalformed, clip([]byte(r.Stream)))
	}
	content, full := bytes.CutSuffix([]byte(r.Log), []byte("\n"))
	return t, r.Stream, !full, content, nil
}

// clip shortens a field quoted in an error.
func clip(b []byte) []byte {
	const limit = 64
	if len(b) > limit {
		return b[:limit]
	}
	return b
}
