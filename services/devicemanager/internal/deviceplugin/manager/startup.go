package manager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// KubeletSocketName is the legacy registration socket's name in the
// device-plugins directory (pkg/layout).
const KubeletSocketName = layout.KubeletSocketName

// KubeletSocketPath returns the path of kubelet.sock in dir.
func KubeletSocketPath(dir string) string { return filepath.Join(dir, KubeletSocketName) }

// ErrKubeletRunning is returned by Open when a kubelet.sock in the
// device-plugins directory answers.
var ErrKubeletRunning = errors.New("a kubelet.sock in the device-plugins directory answers: another kubelet or devicemanager owns it")

// Open runs the devicemanager's start-up sequence up to serving: it
// refuses a kubelet.sock in cfg.DevicePluginsDir that answers
// (ErrKubeletRunning), restores the saved state and redials the endpoints
// it records, and removes stale sockets (see removeStaleSockets). The
// caller then serves kubelet.sock (KubeletSocketPath) and the API, and runs
// Run.
//
// The manager keeps a mirror of its state in the kubelet's format,
// kubelet_internal_checkpoint, beside the store (store.KubeletMirror); at a
// first start, with no saved state, it imports the allocations of a
// kubelet's checkpoint found there.
func Open(ctx context.Context, cfg Config) (*Manager, error) {
	if err := checkKubeletSocket(cfg.DevicePluginsDir); err != nil {
		return nil, err
	}
	if cfg.Store != nil {
		cfg.Store = store.WithKubeletMirror(cfg.Store, cfg.DevicePluginsDir, cfg.Log)
	}
	m, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := m.Restore(ctx); err != nil {
		_ = m.Close()
		return nil, err
	}
	m.syncSpecs()
	if err := removeStaleSockets(cfg.DevicePluginsDir, m.recordedEndpointPaths(), m.log); err != nil {
		_ = m.Close()
		return nil, err
	}
	return m, nil
}

// kubeletDialTimeout bounds the dial of kubelet.sock at start.
const kubeletDialTimeout = time.Second

// dialSocket dials a Unix socket at start to tell whether something
// listens on it. Tests replace it to see a dial error that the kernel
// does not give their user (EACCES, which root never gets).
var dialSocket = func(path string) (net.Conn, error) {
	return net.DialTimeout("unix", path, kubeletDialTimeout)
}

// checkKubeletSocket fails with ErrKubeletRunning when something answers
// on kubelet.sock in dir. Only a refused connection (ECONNREFUSED) means
// the socket is stale and may be replaced; any other failure to dial it (no
// permission, a full backlog, a timeout) cannot tell a dead socket from a
// live kubelet's, so it is an error that stops the start and the socket is
// left alone.
func checkKubeletSocket(dir string) error {
	path := KubeletSocketPath(dir)
	if !unixsock.IsSocket(path) {
		return nil
	}
	c, err := dialSocket(path)
	switch {
	case err == nil:
		_ = c.Close()
		return fmt.Errorf("%s: %w", path, ErrKubeletRunning)
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, fs.ErrNotExist):
		return nil // stale, or gone since: nothing listens
	default:
		return fmt.Errorf("cannot tell whether %s is live, refusing to replace it (remove it if no kubelet or devicemanager owns it): %w", path, err)
	}
}

// recordedEndpointPaths returns the paths, as registered and as resolved,
// of every endpoint the manager knows, live or not.
func (c *core) recordedEndpointPaths() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]bool{}
	for _, res := range c.resources {
		for _, e := range res.endpoints {
			out[e.path] = true
			if e.dialPath != "" {
				out[e.dialPath] = true
			}
		}
	}
	return out
}

// removeStaleSockets removes the sockets in dir (not recursively) that
// refuse connections and belong to no endpoint in recorded, as the design's
// "Stale sockets" asks. kubelet.sock and every other file are left alone.
//
// The kubelet removes every socket there at start, so that legacy plugins
// notice and register again. nodeplug redials the endpoints it recorded
// instead, and a socket that still answers belongs to a plugin that is
// serving: removing it would make the plugin restart its server, and its
// endpoint would be replaced rather than kept. That includes a recorded
// endpoint whose redial did not finish in time on a busy machine.
func removeStaleSockets(dir string, recorded map[string]bool, log *slog.Logger) error {
	conf, err := unixsock.NewConfiner([]string{dir})
	if err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, de := range entries {
		p := filepath.Join(dir, de.Name())
		if de.Name() == KubeletSocketName || de.Type()&fs.ModeSocket == 0 || recorded[p] {
			continue
		}
		if resolved, err := filepath.EvalSymlinks(p); err == nil && recorded[resolved] {
			continue
		}
		if !refusesConnections(conf, p) {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		log.Info("removed stale device plugin socket", "socket", p)
	}
	return errors.Join(errs...)
}

// dialStale connects to the socket at path as conf allows (its directory):
// the socket connected is the one checked, so a symlink renamed over a
// socket since its directory was read is not followed out of it. Tests
// replace it, as dialSocket.
var dialStale = func(conf *unixsock.Confiner, path string) (net.Conn, error) {
	c, _, err := conf.Connect(path)
	return c, err
}

// refusesConnections reports whether nothing listens on the socket at path.
// A socket that accepts, or that cannot be judged (a full backlog, a
// timeout, no permission, not allowed by conf), is not stale.
func refusesConnections(conf *unixsock.Confiner, path string) bool {
	c, err := dialStale(conf, path)
	if err == nil {
		_ = c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
