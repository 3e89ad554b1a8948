// Package bounds holds the limits nodeplug puts on what callers and plugins
// send it (DESIGN "Bounds"): lengths and characters of names, device IDs,
// pod UIDs and container names, and how much of an offending value an error
// may echo.
//
// Every check returns an error wrapping errdefs.ErrInvalidArgument whose
// message quotes at most MaxEcho bytes of the value, so a 100 KB name gives
// a short error.
package bounds

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// The limits.
const (
	// MaxName bounds resource, driver and plugin names (a DNS subdomain
	// with a prefix, as Kubernetes names are).
	MaxName = 253
	// MaxDeviceID bounds device IDs.
	MaxDeviceID = 256
	// MaxPodUID bounds pod UIDs.
	MaxPodUID = 253
	// MaxContainerName bounds container names.
	MaxContainerName = 253
	// MaxPodNamespace and MaxPodName bound a pod's namespace and name.
	MaxPodNamespace = 253
	MaxPodName      = 253
	// MaxEcho is the most of an offending value an error quotes.
	MaxEcho = 256
)

// Quote returns s quoted for an error message, cut to MaxEcho bytes (at a
// rune boundary) with the full length noted when it was cut.
func Quote(s string) string {
	if len(s) <= MaxEcho {
		return strconv.Quote(s)
	}
	cut := MaxEcho
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(s[:cut]), len(s))
}

// check applies the common rules: not empty (unless optional), at most max
// bytes, valid UTF-8, and printable (no NUL, newline or other control
// characters).
func check(what, s string, max int, optional bool) error {
	switch {
	case s == "" && !optional:
		return fmt.Errorf("%s is empty: %w", what, errdefs.ErrInvalidArgument)
	case len(s) > max:
		return fmt.Errorf("%s %s is %d bytes, longer than %d: %w", what, Quote(s), len(s), max, errdefs.ErrInvalidArgument)
	case !utf8.ValidString(s):
		return fmt.Errorf("%s %s is not valid UTF-8: %w", what, Quote(s), errdefs.ErrInvalidArgument)
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return fmt.Errorf("%s %s contains the unprintable character %U: %w", what, Quote(s), r, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// CheckText checks a free text that may be empty (a message, a topology
// attribute, an annotation): at most max bytes, valid UTF-8 and printable.
// what names it in the error.
func CheckText(what, s string, max int) error { return check(what, s, max, true) }

// Name checks a resource, driver or plugin name; what names it in the
// error ("resource name", …).
func Name(what, s string) error { return check(what, s, MaxName, false) }

// DeviceID checks a device ID.
func DeviceID(s string) error { return check("device ID", s, MaxDeviceID, false) }

// PodUID checks a pod UID.
func PodUID(s string) error { return check("pod UID", s, MaxPodUID, false) }

// PodIdentity checks a pod's optional namespace and name: each within
// its bound and printable, and given together or not at all.
func PodIdentity(namespace, name string) error {
	if err := check("pod namespace", namespace, MaxPodNamespace, true); err != nil {
		return err
	}
	if err := check("pod name", name, MaxPodName, true); err != nil {
		return err
	}
	if (namespace == "") != (name == "") {
		return fmt.Errorf("pod namespace %s and name %s must be given together: %w", Quote(namespace), Quote(name), errdefs.ErrInvalidArgument)
	}
	return nil
}

// ContainerName checks a container name; empty is allowed where the caller
// means "every container" (Release).
func ContainerName(s string, optional bool) error {
	return check("container name", s, MaxContainerName, optional)
}
