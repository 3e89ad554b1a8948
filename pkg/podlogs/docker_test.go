package podlogs_test

import (
	"bytes"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/nodeplug/nodeplug/pkg/podlogs"
)

// Lines as docker 20.10's json-file driver wrote them for a program
// printing "args" and a 20000-byte line to stdout, then "e1" to stderr
// (docker cut the long line at 16 KiB: its first part has no newline),
// with "tail" written last to stdout without a newline before the program
// exited. Long lines are shortened here: AAAA and BB stand for the parts.
const dockerLog = "" +
	`{"log":"args\n","stream":"stdout","time":"2026-12-06T20:44:19.491272438Z"}` + "\n" +
	`{"log":"AAAA","stream":"stdout","time":"2026-12-06T20:44:19.491300001Z"}` + "\n" +
	`{"log":"e1\n","stream":"stderr","time":"2026-12-06T20:44:19.491300002Z"}` + "\n" +
	`{"log":"BB\n","stream":"stdout","time":"2026-12-06T20:44:19.491300003Z"}` + "\n" +
	`{"log":"  with \"quotes\", a tab\t and \u00e9\n","stream":"stderr","time":"2026-12-06T20:44:19.491404806Z"}` + "\n" +
	`{"log":"tail","stream":"stdout","time":"2026-12-06T20:44:19.5Z"}` + "\n"

func TestDockerLog(t *testing.T) {
	for _, tc := range []struct {
		name string
		log  string
		opts podlogs.Options
		want string
	}{
		{"both streams", dockerLog, podlogs.Options{TailLines: -1},
			"args\ne1\nAAAABB\n  with \"quotes\", a tab\t and \u00e9\ntail\n"},
		{"stdout", dockerLog, podlogs.Options{Stream: "stdout", TailLines: -1}, "args\nAAAABB\ntail\n"},
		{"stderr, tail 1", dockerLog, podlogs.Options{Stream: "stderr", TailLines: 1}, "  with \"quotes\", a tab\t and \u00e9\n"},
		{"timestamps: a line's first part's", dockerLog, podlogs.Options{Stream: "stdout", Timestamps: true, TailLines: 2},
			"2026-12-06T20:44:19.491300001Z AAAABB\n2026-12-06T20:44:19.5Z tail\n"},
		{"a last line being written", dockerLog + `{"log":"x\n","stre`, podlogs.Options{Stream: "stderr", TailLines: -1},
			"e1\n  with \"quotes\", a tab\t and \u00e9\n"},
		{"empty line", `{"log":"\n","stream":"stdout","time":"2026-01-02T03:04:05Z"}` + "\n", podlogs.Options{TailLines: -1}, "\n"},
		// A link replaced by a copy, or one file of each kind read one
		// after the other: each line is read as what it is.
		{"both formats", lines + dockerLog, podlogs.Options{Stream: "stderr", TailLines: 3},
			"four\ne1\n  with \"quotes\", a tab\t and \u00e9\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			if err := podlogs.Copy(&out, iotest.OneByteReader(strings.NewReader(tc.log)), tc.opts); err != nil {
				t.Fatalf("Copy: %v", err)
			}
			if out.String() != tc.want {
				t.Errorf("Copy wrote %q, want %q", out.String(), tc.want)
			}
		})
	}
}
