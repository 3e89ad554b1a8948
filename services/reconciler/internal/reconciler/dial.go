package reconciler

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Delays between redials of a socket that refuses connections.
const (
	firstRedialDelay = time.Millisecond
	lastRedialDelay  = 8 * time.Millisecond
)

// handOver returns a dialer that hands over the connection already made
// (first) on its first call and dials anew after that.
func handOver(first net.Conn, dial func(context.Context, string) (net.Conn, error)) func(context.Context, string) (net.Conn, error) {
	var once sync.Once
	return func(ctx context.Context, addr string) (net.Conn, error) {
		var c net.Conn
		once.Do(func() { c = first })
		if c != nil {
			return c, nil
		}
		return dial(ctx, addr)
	}
}

// dialListening returns the dialer of a plugin's registration socket at
// path. Every dial, the first and each reconnect, is a c.Connect of path:
// path is checked inside the allowed directories and the socket checked is
// the socket connected (a nil c confines nothing). fsnotify reports a
// socket at bind(), which can be before listen(): a refused connection is
// redialled with a millisecond backoff for at most window (the
// bind→listen gap), then the dial fails. So a stale socket (its plugin
// died without removing it) fails its attempt within window and frees its
// worker, instead of holding it for the GetInfo budget (DESIGN "Stale
// sockets"). A full backlog (EAGAIN) is a live plugin: it is redialled
// until gRPC's connect deadline.
//
// A Unix socket answers a non-blocking connect at once, and only a
// connected socket is handed to the runtime's poller, so the redials of a
// socket that refuses cost a socket, a connect and a close each (with the
// check): a thousand stale sockets are redialled many times in their first
// attempt's window.
func dialListening(c *unixsock.Confiner, path string, window time.Duration) func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) {
		deadline := time.Now().Add(window)
		delay := firstRedialDelay
		for {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			conn, _, err := c.Connect(path)
			switch {
			case err == nil:
				return conn, nil
			case errors.Is(err, syscall.EAGAIN):
			case errors.Is(err, syscall.ECONNREFUSED):
				if !time.Now().Before(deadline) {
					return nil, fmt.Errorf("socket refuses connections (nothing listens on it) after %s: %w", window, err)
				}
			default:
				return nil, err
			}
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, ctx.Err()
			case <-t.C:
			}
			delay = min(2*delay, lastRedialDelay)
		}
	}
}
