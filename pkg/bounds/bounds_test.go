package bounds

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

func TestChecks(t *testing.T) {
	long := strings.Repeat("a", 100<<10)
	for _, tc := range []struct {
		name string
		err  error
		ok   bool
	}{
		{"name", Name("resource name", "example.com/gpu"), true},
		{"empty name", Name("resource name", ""), false},
		{"name of 253", Name("resource name", strings.Repeat("n", 253)), true},
		{"name of 254", Name("resource name", strings.Repeat("n", 254)), false},
		{"device of 256", DeviceID(strings.Repeat("d", 256)), true},
		{"device of 257", DeviceID(strings.Repeat("d", 257)), false},
		{"uid with NUL", PodUID("pod\x00x"), false},
		{"uid with newline", PodUID("pod\nx"), false},
		{"uid not UTF-8", PodUID("pod\xff"), false},
		{"uid", PodUID("0d6b1a6e-0c0f-4f0e-9a8e-3f0c1e7d2b11"), true},
		{"container optional", ContainerName("", true), true},
		{"container required", ContainerName("", false), false},
		{"huge", Name("plugin name", long), false},
		{"no pod identity", PodIdentity("", ""), true},
		{"pod identity", PodIdentity("default", "web-0"), true},
		{"pod identity of 253", PodIdentity(strings.Repeat("s", 253), strings.Repeat("n", 253)), true},
		{"pod namespace of 254", PodIdentity(strings.Repeat("s", 254), "n"), false},
		{"pod name of 254", PodIdentity("ns", strings.Repeat("n", 254)), false},
		{"pod name with newline", PodIdentity("ns", "a\nb"), false},
		{"pod namespace alone", PodIdentity("ns", ""), false},
		{"pod name alone", PodIdentity("", "web-0"), false},
		{"huge pod name", PodIdentity("ns", long), false},
		{"empty text", CheckText("health message", "", 16), true},
		{"text of 16", CheckText("health message", strings.Repeat("t", 16), 16), true},
		{"text of 17", CheckText("health message", strings.Repeat("t", 17), 16), false},
		{"text with tab", CheckText("health message", "a\tb", 16), false},
		{"text not UTF-8", CheckText("health message", "\xff", 16), false},
		{"huge text", CheckText("health message", long, 1024), false},
	} {
		if (tc.err == nil) != tc.ok {
			t.Errorf("%s: %v, want ok=%v", tc.name, tc.err, tc.ok)
		}
		if tc.err != nil {
			if !errors.Is(tc.err, errdefs.ErrInvalidArgument) {
				t.Errorf("%s: %v does not wrap ErrInvalidArgument", tc.name, tc.err)
			}
			if len(tc.err.Error()) > MaxEcho+200 {
				t.Errorf("%s: error is %d bytes long", tc.name, len(tc.err.Error()))
			}
		}
	}
}

// FuzzChecks: no input panics, every error is short and wraps
// ErrInvalidArgument, and what passes is printable UTF-8 within the limit.
func FuzzChecks(f *testing.F) {
	for _, s := range []string{"", "example.com/gpu", "a\x00b", "\n", "\xff\xfe", strings.Repeat("é", 300), "pod-1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, err := range []error{Name("name", s), DeviceID(s), PodUID(s), ContainerName(s, true)} {
			if err == nil {
				if !utf8.ValidString(s) || strings.ContainsAny(s, "\x00\n") || len(s) > MaxDeviceID {
					t.Fatalf("%q passed", s)
				}
				continue
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("%v does not wrap ErrInvalidArgument", err)
			}
			if len(err.Error()) > 4*MaxEcho+200 {
				t.Fatalf("error of %d bytes for a %d-byte value", len(err.Error()), len(s))
			}
		}
	})
}
