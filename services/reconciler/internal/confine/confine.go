// Package confine applies the confinement of plugin endpoints (DESIGN
// "Paths" and "Failure and bad input") at the two moments the reconciler
// needs it: when a plugin's GetInfo answer is validated, the endpoint may
// not exist yet and is judged by where it would be; when a handler is
// about to dial it, Resolve waits for it to exist and resolve, symlinks
// followed, inside the allowed directories. The dial itself checks it
// again, every time, on the socket it connects: handlers and the
// reconciler dial through unixsock.Confiner.Dialer and Connect, never by
// the path Resolve returned.
//
// A nil Confiner confines nothing. The functions are safe for concurrent
// use.
package confine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Check is the check at validation: an endpoint that exists must resolve
// inside the allowed directories (unixsock.Confiner.Resolve); one that
// does not exist yet must be one that MayAppear. Errors wrap
// errdefs.ErrInvalidArgument.
func Check(c *unixsock.Confiner, endpoint string) error {
	if c == nil {
		return nil
	}
	_, err := resolve(c, endpoint)
	if err != nil && !errors.Is(err, errMayAppear) {
		return fmt.Errorf("endpoint not allowed: %w", err)
	}
	return nil
}

// errMayAppear: the endpoint does not exist yet, and MayAppear.
var errMayAppear = errors.New("endpoint does not exist yet")

// resolve resolves endpoint inside the allowed directories, or says
// (errMayAppear) that it does not exist yet and MayAppear. An endpoint that
// appears between the two looks is judged by what is there.
func resolve(c *unixsock.Confiner, endpoint string) (string, error) {
	dial, err := c.Resolve(endpoint)
	if err == nil {
		return dial, nil
	}
	if MayAppear(c, endpoint) {
		return "", errMayAppear
	}
	return c.Resolve(endpoint)
}

// MayAppear reports whether endpoint does not exist yet and, once created,
// would lie inside the allowed directories: it is absolute, has no ".."
// component, is inside them by its path, does not exist, and the deepest
// of its parent directories that exists resolves (symlinks followed)
// inside them. A parent directory that is a symlink leading out therefore
// makes it fail. Whatever is created later is checked again at dial time
// (Resolve).
func MayAppear(c *unixsock.Confiner, endpoint string) bool {
	if !filepath.IsAbs(endpoint) || slices.Contains(strings.Split(endpoint, string(filepath.Separator)), "..") {
		return false
	}
	clean := filepath.Clean(endpoint)
	if !c.Within(clean) {
		return false
	}
	if _, err := os.Lstat(clean); !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	for dir := filepath.Dir(clean); ; {
		resolved, err := filepath.EvalSymlinks(dir)
		if err == nil {
			return c.Within(resolved)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return false
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return false
		}
		dir = parent
	}
}

// Resolve is the check before a dial: it returns endpoint resolved
// (symlinks followed) inside the allowed directories, for messages; the
// dial checks again (unixsock.Confiner.Dialer). While the
// endpoint does not exist yet and MayAppear, it waits for it, polling with
// a short backoff, until ctx ends. With a nil Confiner it returns endpoint
// itself. Errors wrap errdefs.ErrInvalidArgument (not allowed) or
// errdefs.ErrUnavailable (never appeared).
func Resolve(ctx context.Context, c *unixsock.Confiner, endpoint string) (string, error) {
	if c == nil {
		return endpoint, nil
	}
	dial, err := c.WaitResolve(ctx, endpoint, func(p string) bool { return MayAppear(c, p) })
	if err != nil && !errors.Is(err, errdefs.ErrUnavailable) {
		return "", fmt.Errorf("endpoint not allowed: %w", err)
	}
	return dial, err
}
