package podlogs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"time"
)

// Options choose the lines Copy and Read give, as kubectl logs' flags do.
type Options struct {
	// Stream is Stdout or Stderr for that stream's lines only, or "" for
	// both.
	Stream string
	// Timestamps begins each line Copy writes with its time (RFC 3339
	// with nanoseconds) and a space, as kubectl logs --timestamps does.
	// Read ignores it: its entries hold the time.
	Timestamps bool
	// TailLines is how many of the last lines to give; below 0, all of
	// them. It counts whole lines (joined from their parts) of the
	// chosen streams.
	TailLines int
}

func (o Options) check() error {
	switch o.Stream {
	case "", Stdout, Stderr:
		return nil
	}
	return fmt.Errorf("podlogs: stream %q: want %s, %s or \"\" for both", o.Stream, Stdout, Stderr)
}

// Copy writes the lines of the CRI log in r to w as kubectl logs prints
// them: each line's content followed by a newline, its time first when
// opts.Timestamps is set. It stops at the first line not in the CRI log
// format, with an error naming the line's number; the lines before it
// have been written then (unless opts.TailLines asks for the last ones).
func Copy(w io.Writer, r io.Reader, opts Options) error {
	bw := bufio.NewWriter(w)
	var stamp []byte
	err := each(r, opts, func(e Entry) error {
		if opts.Timestamps {
			stamp = e.Time.AppendFormat(stamp[:0], time.RFC3339Nano)
			stamp = append(stamp, ' ')
			if _, err := bw.Write(stamp); err != nil {
				return err
			}
		}
		if _, err := bw.Write(e.Content); err != nil {
			return err
		}
		return bw.WriteByte('\n')
	})
	if ferr := bw.Flush(); err == nil {
		err = ferr
	}
	return err
}

// Read is the lines of the CRI log in r that opts choose, in order.
func Read(r io.Reader, opts Options) ([]Entry, error) {
	var out []Entry
	err := each(r, opts, func(e Entry) error {
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// each calls fn with each line opts choose, in order.
func each(r io.Reader, opts Options, fn func(Entry) error) error {
	if err := opts.check(); err != nil {
		return err
	}
	tail := newTail(opts.TailLines)
	lr := NewReader(r)
	for {
		e, err := lr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		if opts.Stream != "" && e.Stream != opts.Stream {
			continue
		}
		if tail == nil {
			if err := fn(e); err != nil {
				return err
			}
			continue
		}
		tail.add(e)
	}
	if tail != nil {
		return tail.each(fn)
	}
	return nil
}

// tailRing keeps the last n entries it is given.
type tailRing struct {
	n       int
	entries []Entry
	next    int // where the next entry goes once the ring is full
}

// newTail keeps the last n entries; below 0 it is nil: keep them all.
func newTail(n int) *tailRing {
	if n < 0 {
		return nil
	}
	return &tailRing{n: n}
}

func (t *tailRing) add(e Entry) {
	switch {
	case t.n == 0:
	case len(t.entries) < t.n:
		t.entries = append(t.entries, e)
	default:
		t.entries[t.next] = e
		t.next = (t.next + 1) % t.n
	}
}

// each calls fn with the entries kept, oldest first.
func (t *tailRing) each(fn func(Entry) error) error {
	for i := range t.entries {
		if err := fn(t.entries[(t.next+i)%len(t.entries)]); err != nil {
			return err
		}
	}
	return nil
}
