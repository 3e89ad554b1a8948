package podworker

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// Messages are bounded, cut on a rune boundary, and say how long they
// were; short ones are kept as they are.
func TestMessageIsBounded(t *testing.T) {
	if got := message("short"); got != "short" {
		t.Fatalf("short message: %q", got)
	}
	long := strings.Repeat("é", maxMessage) // 2 bytes each
	got := message(long)
	if len(got) > maxMessage+64 || !utf8.ValidString(got) || !strings.HasSuffix(got, "(8192 bytes in all)") {
		t.Fatalf("long message: %d bytes, valid %v, ends %q", len(got), utf8.ValidString(got), got[len(got)-32:])
	}
	if got := message("a\xffb"); !utf8.ValidString(got) {
		t.Fatalf("invalid UTF-8 kept: %q", got)
	}
}
