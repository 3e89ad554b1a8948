package reconciler

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// Bounds on a GetInfo answer beyond those of pkg/bounds (DESIGN "Bounds").
// Real plugins offer one to three versions of a few bytes each: a CSI
// semver, a DRA gRPC service name, "v1beta1".
const (
	// MaxVersions bounds how many supported versions a plugin may offer.
	MaxVersions = 16
	// MaxVersionLen bounds each supported version.
	MaxVersionLen = 64
)

// checkInfo checks what a plugin's GetInfo said against DESIGN "Bounds",
// before any of it is recorded, logged or echoed: the name (pkg/bounds),
// the type (as long and printable as a name, empty allowed: no handler
// takes it), the endpoint (a Unix socket path of at most
// unixsock.MaxPathLen bytes, without NUL) and the versions (at most
// MaxVersions, each at most MaxVersionLen bytes and printable). The error
// wraps errdefs.ErrInvalidArgument and quotes at most bounds.MaxEcho bytes
// of the offending value.
func checkInfo(p cache.Plugin) error {
	if err := bounds.Name("plugin name", p.Name); err != nil {
		return err
	}
	if p.Type != "" {
		if err := bounds.Name("plugin type", p.Type); err != nil {
			return err
		}
	}
	switch {
	case len(p.Endpoint) > unixsock.MaxPathLen:
		return fmt.Errorf("endpoint %s is %d bytes, longer than the %d-byte limit of a Unix socket path: %w",
			bounds.Quote(p.Endpoint), len(p.Endpoint), unixsock.MaxPathLen, errdefs.ErrInvalidArgument)
	case strings.ContainsRune(p.Endpoint, 0):
		return fmt.Errorf("endpoint %s contains a NUL byte: %w", bounds.Quote(p.Endpoint), errdefs.ErrInvalidArgument)
	case len(p.Versions) > MaxVersions:
		return fmt.Errorf("%d supported versions, more than %d: %w", len(p.Versions), MaxVersions, errdefs.ErrInvalidArgument)
	}
	for _, v := range p.Versions {
		if len(v) > MaxVersionLen {
			return fmt.Errorf("supported version %s is %d bytes, longer than %d: %w", bounds.Quote(v), len(v), MaxVersionLen, errdefs.ErrInvalidArgument)
		}
		if !printable(v) {
			return fmt.Errorf("supported version %s is not printable UTF-8: %w", bounds.Quote(v), errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// clipped returns p with what a plugin said cut to what may be recorded
// and echoed once checkInfo refused it: each string at most bounds.MaxEcho
// bytes, at most MaxVersions versions.
func clipped(p cache.Plugin) cache.Plugin {
	p.Name, p.Type, p.Endpoint = clip(p.Name), clip(p.Type), clip(p.Endpoint)
	if len(p.Versions) > MaxVersions {
		p.Versions = p.Versions[:MaxVersions]
	}
	vs := make([]string, len(p.Versions))
	for i, v := range p.Versions {
		vs[i] = clip(v)
	}
	p.Versions = vs
	return p
}

// clip cuts s to at most bounds.MaxEcho bytes, at a rune boundary.
func clip(s string) string {
	if len(s) <= bounds.MaxEcho {
		return s
	}
	cut := bounds.MaxEcho
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
