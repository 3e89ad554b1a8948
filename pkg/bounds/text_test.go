package bounds

import (
	"bytes"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

func TestPathText(t *testing.T) {
	for _, tc := range []struct {
		path, text string
		twin       bool
	}{
		{"/var/lib/kubelet/plugins_registry/a.sock", "/var/lib/kubelet/plugins_registry/a.sock", false},
		{"/r/é-gpu.sock", "/r/é-gpu.sock", false},
		{"/r/bad\xff\xfe.sock", `"/r/bad\xff\xfe.sock"`, true},
		{"/r/tab\tand\"quote\xc3", `"/r/tab\tand\"quote\xc3"`, true},
		// Relative, and starting with a quote: quoted too, so that
		// PathFromText cannot mistake it for a quoted path.
		{`"x"`, `"\"x\""`, true},
	} {
		text := PathText(tc.path)
		if text != tc.text {
			t.Errorf("PathText(%q) = %q, want %q", tc.path, text, tc.text)
		}
		if !utf8.ValidString(text) {
			t.Errorf("PathText(%q) = %q is not UTF-8", tc.path, text)
		}
		b := PathBytes(tc.path)
		if (b != nil) != tc.twin || (b != nil && !bytes.Equal(b, []byte(tc.path))) {
			t.Errorf("PathBytes(%q) = %q, want twin=%v", tc.path, b, tc.twin)
		}
		for _, wire := range [][]byte{nil, b} {
			got, err := PathFromWire(text, wire)
			if err != nil || got != tc.path {
				t.Errorf("PathFromWire(%q, %q) = %q, %v; want %q", text, wire, got, err, tc.path)
			}
		}
	}
	if _, err := PathFromText(`"/r/unterminated`); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("PathFromText of a broken quoted path: %v, want ErrInvalidArgument", err)
	}
}

func TestText(t *testing.T) {
	for in, want := range map[string]string{
		"plain":             "plain",
		"é ok":              "é ok",
		"bad\xff\xfe.sock":  "bad\uFFFD.sock",
		"cut \xe2\x82 rune": "cut \uFFFD rune",
	} {
		if got := Text(in); got != want || !utf8.ValidString(got) {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzPathText: every byte string a file name can hold (and any other)
// becomes valid UTF-8 text, and comes back unchanged from the text alone
// and from the text with its bytes twin.
func FuzzPathText(f *testing.F) {
	for _, s := range []string{"/r/a.sock", "/r/bad\xff\xfe.sock", `"`, `"/x"`, "\xc3", "/r/\x00", "/r/é\xe2\x82.sock", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		text := PathText(p)
		if !utf8.ValidString(text) {
			t.Fatalf("PathText(%q) = %q is not UTF-8", p, text)
		}
		if got, err := PathFromText(text); err != nil || got != p {
			t.Fatalf("PathFromText(PathText(%q)) = %q, %v", p, got, err)
		}
		if got, err := PathFromWire(text, PathBytes(p)); err != nil || got != p {
			t.Fatalf("PathFromWire of %q = %q, %v", p, got, err)
		}
		if got := Text(p); !utf8.ValidString(got) || (utf8.ValidString(p) && got != p) {
			t.Fatalf("Text(%q) = %q", p, got)
		}
		if err := Name("name", p); err != nil && !utf8.ValidString(err.Error()) {
			t.Fatalf("error for %q is not UTF-8: %q", p, err.Error())
		}
	})
}
