package podlogs_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/nodeplug/nodeplug/pkg/podlogs"
)

// Records as podman 4.3.1's k8s-file log driver wrote them: a program
// printing a 20000-byte line, then "no newline at end" to stdout and
// "err no newline" to stderr without newlines before exiting. conmon
// cut the long line at 8 KiB, and wrote each stream's unfinished line as
// a P record when the container exited.
const podmanLog = "" +
	"2026-12-06T17:33:17.183964472+00:00 stdout P AAAA\n" +
	"2026-12-06T17:33:17.184287433+00:00 stderr P err no newline\n" +
	"2026-12-06T17:33:17.184321397+00:00 stdout P BBBB\n" +
	"2026-12-06T17:33:17.184335824+00:00 stdout F CC\n" +
	"2026-12-06T17:33:17.184335824+00:00 stdout P no newline at end\n"

// lines is a log of full lines from both streams, with times in both
// spellings of UTC.
const lines = "" +
	"2026-01-02T03:04:05.000000001Z stdout F one\n" +
	"2026-01-02T03:04:05.1+00:00 stderr F two\n" +
	"2026-01-02T03:04:06Z stdout F three\n" +
	"2026-01-02T03:04:07.5Z stderr F four\n"

func TestCopy(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  string
		opts podlogs.Options
		want string
	}{
		{"both streams", lines, podlogs.Options{TailLines: -1}, "one\ntwo\nthree\nfour\n"},
		{"stdout", lines, podlogs.Options{Stream: "stdout", TailLines: -1}, "one\nthree\n"},
		{"stderr", lines, podlogs.Options{Stream: "stderr", TailLines: -1}, "two\nfour\n"},
		{"tail 0", lines, podlogs.Options{TailLines: 0}, ""},
		{"tail 1", lines, podlogs.Options{TailLines: 1}, "four\n"},
		{"tail 3", lines, podlogs.Options{TailLines: 3}, "two\nthree\nfour\n"},
		{"tail beyond", lines, podlogs.Options{TailLines: 10}, "one\ntwo\nthree\nfour\n"},
		{"tail of stdout", lines, podlogs.Options{Stream: "stdout", TailLines: 1}, "three\n"},
		{"timestamps", lines, podlogs.Options{Timestamps: true, TailLines: -1},
			"2026-01-02T03:04:05.000000001Z one\n2026-01-02T03:04:05.1Z two\n2026-01-02T03:04:06Z three\n2026-01-02T03:04:07.5Z four\n"},
		{"timestamps in another zone", "2026-01-02T03:04:05.25+02:00 stdout F x\n", podlogs.Options{Timestamps: true, TailLines: -1},
			"2026-01-02T03:04:05.25+02:00 x\n"},
		{"partials joined", "2026-01-02T03:04:05Z stdout P ab\n2026-01-02T03:04:06Z stdout P cd\n2026-01-02T03:04:07Z stdout F ef\n",
			podlogs.Options{Timestamps: true, TailLines: -1}, "2026-01-02T03:04:05Z abcdef\n"},
		{"partials of both streams", podmanLog, podlogs.Options{TailLines: -1}, "AAAABBBBCC\nerr no newline\nno newline at end\n"},
		{"partials, stderr", podmanLog, podlogs.Options{Stream: "stderr", TailLines: -1}, "err no newline\n"},
		{"partials, tail 2", podmanLog, podlogs.Options{TailLines: 2}, "err no newline\nno newline at end\n"},
		{"empty content", "2026-01-02T03:04:05Z stdout F\n2026-01-02T03:04:05Z stdout F \n2026-01-02T03:04:05Z stdout P \n2026-01-02T03:04:05Z stdout F x\n",
			podlogs.Options{TailLines: -1}, "\n\nx\n"},
		{"spaces kept", "2026-01-02T03:04:05Z stdout F   indented  \n2026-01-02T03:04:05Z stdout F a\tb\r\n",
			podlogs.Options{TailLines: -1}, "  indented  \na\tb\r\n"},
		{"more tags", "2026-01-02T03:04:05Z stdout P:x a\n2026-01-02T03:04:05Z stdout F:y:z b\n", podlogs.Options{TailLines: -1}, "ab\n"},
		{"a last record being written", lines + "2026-01-02T03:04:08Z stdout F fi", podlogs.Options{TailLines: -1}, "one\ntwo\nthree\nfour\n"},
		{"empty", "", podlogs.Options{TailLines: -1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			// One byte at a time: nothing depends on how the input is read.
			if err := podlogs.Copy(&out, iotest.OneByteReader(strings.NewReader(tc.log)), tc.opts); err != nil {
				t.Fatalf("Copy: %v", err)
			}
			if out.String() != tc.want {
				t.Errorf("Copy wrote %q, want %q", out.String(), tc.want)
			}
		})
	}
}

func TestMalformed(t *testing.T) {
	good := "2026-01-02T03:04:05Z stdout F ok\n"
	for _, tc := range []struct {
		name string
		bad  string
		want string
	}{
		{"blank", "\n", "no stream"},
		{"no stream", "2026-01-02T03:04:05Z\n", "no stream"},
		{"bad time", "2026-01-02 stdout F x\n", "not RFC 3339"},
		{"time without zone", "2026-01-02T03:04:05 stdout F x\n", "not RFC 3339"},
		{"bad stream", "2026-01-02T03:04:05Z stdin F x\n", "neither stdout nor stderr"},
		{"no tag", "2026-01-02T03:04:05Z stdout\n", "no tag"},
		{"bad tag", "2026-01-02T03:04:05Z stdout X x\n", "neither P nor F"},
		{"docker json cut", `{"log":"x\n","stream":"stdout"` + "\n", "not docker's JSON"},
		{"docker json, bad time", `{"log":"x\n","stream":"stdout","time":"yesterday"}` + "\n", "not RFC 3339"},
		{"docker json, no time", `{"log":"x\n","stream":"stdout"}` + "\n", "not RFC 3339"},
		{"docker json, bad stream", `{"log":"x\n","stream":"stdin","time":"2026-01-02T03:04:05Z"}` + "\n", "neither stdout nor stderr"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := podlogs.Copy(&out, strings.NewReader(good+good+tc.bad+good), podlogs.Options{TailLines: -1})
			if !errors.Is(err, podlogs.ErrMalformed) || !strings.Contains(err.Error(), "line 3:") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Copy: %v; want an error wrapping ErrMalformed about line 3, saying %q", err, tc.want)
			}
			if out.String() != "ok\nok\n" {
				t.Errorf("Copy wrote %q before the malformed line, want the two lines before it", out.String())
			}
		})
	}
}

// A line far longer than bufio.Scanner's 64 KiB limit, in one record and
// in records of 8 KiB as conmon writes it.
func TestLongLine(t *testing.T) {
	long := strings.Repeat("0123456789abcdef", 80<<10) // 1.25 MiB
	var split strings.Builder
	for rest := long; rest != ""; {
		n := min(len(rest), 8192)
		tag := "P"
		if n == len(rest) {
			tag = "F"
		}
		split.WriteString("2026-01-02T03:04:05Z stdout " + tag + " " + rest[:n] + "\n")
		rest = rest[n:]
	}
	for name, log := range map[string]string{
		"one record": "2026-01-02T03:04:05Z stdout F " + long + "\n",
		"parts":      split.String(),
	} {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if err := podlogs.Copy(&out, strings.NewReader(lines+log+lines), podlogs.Options{TailLines: -1}); err != nil {
				t.Fatal(err)
			}
			want := "one\ntwo\nthree\nfour\n" + long + "\none\ntwo\nthree\nfour\n"
			if out.String() != want {
				t.Errorf("Copy wrote %d bytes, want %d: the long line and the lines around it", out.Len(), len(want))
			}
		})
	}
}

func TestRead(t *testing.T) {
	got, err := podlogs.Read(strings.NewReader(podmanLog), podlogs.Options{TailLines: -1, Timestamps: true})
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	want := []podlogs.Entry{
		{Time: at("2026-12-06T17:33:17.183964472Z"), Stream: "stdout", Content: []byte("AAAABBBBCC")},
		{Time: at("2026-12-06T17:33:17.184287433Z"), Stream: "stderr", Content: []byte("err no newline")},
		{Time: at("2026-12-06T17:33:17.184335824Z"), Stream: "stdout", Content: []byte("no newline at end")},
	}
	if len(got) != len(want) {
		t.Fatalf("Read = %d entries, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if !g.Time.Equal(w.Time) || g.Stream != w.Stream || !bytes.Equal(g.Content, w.Content) {
			t.Errorf("entry %d = %s %s %q, want %s %s %q", i, g.Time, g.Stream, g.Content, w.Time, w.Stream, w.Content)
		}
	}

	if _, err := podlogs.Read(strings.NewReader(lines), podlogs.Options{Stream: "stdin"}); err == nil {
		t.Error("Read with stream stdin: no error")
	}
}

// The reader's entries stay as they were while it goes on reading.
func TestReaderEntriesOwnTheirContent(t *testing.T) {
	r := podlogs.NewReader(strings.NewReader(lines))
	var got []podlogs.Entry
	for {
		e, err := r.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, e)
	}
	var s []string
	for _, e := range got {
		s = append(s, string(e.Content))
	}
	if strings.Join(s, ",") != "one,two,three,four" {
		t.Errorf("entries %q", s)
	}
}

func TestCopyErrors(t *testing.T) {
	boom := errors.New("boom")
	if err := podlogs.Copy(io.Discard, iotest.ErrReader(boom), podlogs.Options{TailLines: -1}); !errors.Is(err, boom) {
		t.Errorf("Copy from a failing reader: %v, want its error", err)
	}
	w := failingWriter{boom}
	if err := podlogs.Copy(w, strings.NewReader(strings.Repeat(lines, 2000)), podlogs.Options{TailLines: -1}); !errors.Is(err, boom) {
		t.Errorf("Copy to a failing writer: %v, want its error", err)
	}
	if err := podlogs.Copy(io.Discard, strings.NewReader(lines), podlogs.Options{Stream: "both"}); err == nil {
		t.Error("Copy with stream both: no error")
	}
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }
