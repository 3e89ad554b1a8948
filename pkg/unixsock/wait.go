package unixsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// The delays between two looks of WaitResolve: they double from the first
// to the last, so an endpoint created at once is seen at once and one that
// comes late costs ten looks a second.
const (
	firstWaitDelay = time.Millisecond
	lastWaitDelay  = 100 * time.Millisecond
)

// MayAppear reports whether path is a confined endpoint that does not exist
// yet: absolute, with no ".." component, inside the allowed directories by
// its name, and missing (or a symlink to something missing). Whatever
// appears there is checked by Resolve.
func (c *Confiner) MayAppear(path string) bool {
	if !filepath.IsAbs(path) || slices.Contains(strings.Split(path, string(filepath.Separator)), "..") || !c.Within(filepath.Clean(path)) {
		return false
	}
	_, err := os.Stat(path)
	return errors.Is(err, fs.ErrNotExist)
}

// WaitResolve is Resolve for an endpoint that may be created after it is
// named (a plugin may register before it serves). While path does not
// resolve and mayAppear(path) reports that it may still appear, it looks
// again after a delay that doubles from 1 ms up to 100 ms, until ctx ends;
// only the caller waits. A nil mayAppear is c.MayAppear. An endpoint that
// appears between two looks is judged by what is there.
//
// Errors: Resolve's (wrapping errdefs.ErrInvalidArgument) when path is not
// allowed or cannot appear; when ctx ends first, one that wraps ctx's error
// and errdefs.ErrUnavailable. It is safe for concurrent use.
func (c *Confiner) WaitResolve(ctx context.Context, path string, mayAppear func(path string) bool) (string, error) {
	if mayAppear == nil {
		mayAppear = c.MayAppear
	}
	var timer *time.Timer
	for delay := firstWaitDelay; ; delay = min(2*delay, lastWaitDelay) {
		resolved, err := c.Resolve(path)
		if err == nil {
			return resolved, nil
		}
		if !mayAppear(path) {
			// It may have appeared since the look above.
			return c.Resolve(path)
		}
		if timer == nil {
			timer = time.NewTimer(delay)
			defer timer.Stop()
		} else {
			timer.Reset(delay)
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("endpoint %s did not appear: %w: %w", bounds.Quote(path), ctx.Err(), errdefs.ErrUnavailable)
		case <-timer.C:
		}
	}
}
