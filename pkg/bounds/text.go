package bounds

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// A file name may hold any bytes but NUL and "/", while a proto string field
// must hold valid UTF-8: a message with one invalid string fails to marshal
// as a whole, so one odd file name would fail a whole List or Watch
// response (DESIGN "Bounds": no byte string a file name can hold fails a
// stream). PathText and PathBytes put a path into a proto message losslessly;
// PathFromWire takes it out again. Text makes any other outside value (a
// plugin's error text, a name echoed in a message) safe for a proto string
// or a metric label.

// PathText returns p as a proto string field carries it: p itself when it is
// valid UTF-8 and does not start with a double quote, else p quoted as Go
// does (strconv.Quote: the bytes that are not UTF-8 become \xNN escapes).
// The quoted form starts with `"`, which an absolute path never does, so
// PathFromText tells the two apart and the mapping is lossless for every
// byte string.
func PathText(p string) string {
	if !escaped(p) {
		return p
	}
	return strconv.Quote(p)
}

// PathBytes returns p's bytes when PathText escapes it (the value of a
// message's bytes twin of a path field, e.g. path_bytes), nil otherwise.
func PathBytes(p string) []byte {
	if !escaped(p) {
		return nil
	}
	return []byte(p)
}

func escaped(p string) bool { return strings.HasPrefix(p, `"`) || !utf8.ValidString(p) }

// PathFromText returns the path that PathText(path) == s. A quoted s that
// does not unquote is refused with an error wrapping
// errdefs.ErrInvalidArgument.
func PathFromText(s string) (string, error) {
	if !strings.HasPrefix(s, `"`) {
		return s, nil
	}
	p, err := strconv.Unquote(s)
	if err != nil {
		return "", fmt.Errorf("path %s starts with a double quote but is not a quoted path: %w", Quote(s), errdefs.ErrInvalidArgument)
	}
	return p, nil
}

// PathFromWire returns the path a message carries in a string field and its
// bytes twin: the bytes when they are set, else PathFromText(text).
func PathFromWire(text string, b []byte) (string, error) {
	if len(b) > 0 {
		return string(b), nil
	}
	return PathFromText(text)
}

// Text returns s with every byte sequence that is not UTF-8 replaced by
// U+FFFD, for a proto string field, a status message or a metric label
// that echoes a value from outside (a plugin's error text, a path inside a
// message). Valid UTF-8 is returned unchanged.
func Text(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
