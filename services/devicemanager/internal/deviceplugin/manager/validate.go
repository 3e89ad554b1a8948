package manager

import (
	"fmt"
	"strings"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Limits of a registration beyond pkg/bounds' names.
const (
	// maxGeneration bounds the opaque generation string.
	maxGeneration = 256
	// maxVersions bounds the bytes of all a plugin's versions together, so
	// the kubelet's version message, which lists them, stays short.
	maxVersions = bounds.MaxEcho
)

// ValidateRegistration checks a registration as Register does before it
// touches the filesystem: the bounds of every field (DESIGN "Bounds":
// lengths and characters, errors that echo at most bounds.MaxEcho bytes of
// a value), then the kubelet's version and resource-name checks, with its
// error messages for each registration path. Where the endpoint may be
// dialled is checked by Register itself. Errors wrap
// errdefs.ErrInvalidArgument.
func ValidateRegistration(r Registration) error {
	if err := validateBounds(r); err != nil {
		return err
	}
	var err error
	if r.Path == PathKubeletSock {
		// A legacy Register names exactly one version.
		v := ""
		if len(r.Versions) == 1 {
			v = r.Versions[0]
		}
		err = kubeletrules.ValidateLegacyRegister(v, r.Resource)
	} else {
		err = kubeletrules.ValidatePluginWatcher(r.Resource, r.Versions)
	}
	if err != nil {
		return kubeletrules.New(err.Error(), "", errdefs.ErrInvalidArgument)
	}
	return nil
}

func validateBounds(r Registration) error {
	// An empty name gets the kubelet's message, below.
	if r.Resource != "" {
		if err := bounds.Name("resource name", r.Resource); err != nil {
			return err
		}
	}
	if err := socketPath("endpoint", r.Endpoint, false); err != nil {
		return err
	}
	if err := registrationSocketPath(r.SocketPath); err != nil {
		return err
	}
	if err := bounds.CheckText("generation", r.Generation, maxGeneration); err != nil {
		return err
	}
	n := 0
	for _, v := range r.Versions {
		if err := bounds.CheckText("version", v, bounds.MaxName); err != nil {
			return err
		}
		n += len(v)
	}
	if n > maxVersions {
		return fmt.Errorf("versions %s: %d bytes together, more than %d: %w", bounds.Quote(fmt.Sprint(r.Versions)), n, maxVersions, errdefs.ErrInvalidArgument)
	}
	return nil
}

// socketPath checks the bounds of a Unix socket path: at most
// unixsock.MaxPathLen bytes, printable. Where it may be dialled is the
// Confiner's business.
func socketPath(what, p string, optional bool) error {
	switch {
	case p == "" && optional:
		return nil
	case p == "":
		return fmt.Errorf("%s is empty: %w", what, errdefs.ErrInvalidArgument)
	case len(p) > unixsock.MaxPathLen:
		return fmt.Errorf("%s %s is %d bytes, longer than the %d bytes a Unix socket path may have: %w",
			what, bounds.Quote(p), len(p), unixsock.MaxPathLen, errdefs.ErrInvalidArgument)
	}
	return bounds.CheckText(what, p, unixsock.MaxPathLen)
}

// registrationSocketPath checks a registration socket path. One that is not
// UTF-8 comes quoted (bounds.PathText, by the reconciler): the path it names
// is held to the bounds of a Unix socket path, the quoted form (at most four
// bytes for each of the path's, and the quotes) to be printable.
func registrationSocketPath(p string) error {
	raw, err := bounds.PathFromText(p)
	switch {
	case err != nil:
		return fmt.Errorf("socket path: %w", err)
	case raw == p:
		return socketPath("socket path", p, true)
	case len(raw) > unixsock.MaxPathLen:
		return fmt.Errorf("socket path %s is %d bytes, longer than the %d bytes a Unix socket path may have: %w",
			bounds.Quote(p), len(raw), unixsock.MaxPathLen, errdefs.ErrInvalidArgument)
	case strings.ContainsRune(raw, 0):
		return fmt.Errorf("socket path %s contains a NUL byte: %w", bounds.Quote(p), errdefs.ErrInvalidArgument)
	}
	return bounds.CheckText("socket path", p, 4*unixsock.MaxPathLen+2)
}
