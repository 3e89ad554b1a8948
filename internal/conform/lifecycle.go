package conform

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// Substitute replaces {root}, {kubelet-sock}, {plugins-registry} and
// {device-plugins} in args by the paths under root.
func Substitute(args []string, root string) []string {
	rep := strings.NewReplacer(
		"{root}", root,
		"{kubelet-sock}", layout.KubeletSocket(root),
		"{plugins-registry}", layout.PluginsRegistryDir(root),
		"{device-plugins}", layout.DevicePluginsDir(root),
	)
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = rep.Replace(a)
	}
	return out
}

func (r *runner) registryDir() string { return layout.PluginsRegistryDir(r.root) }

// runCommand starts the plugin under a temporary root dir with conform's
// kubelet.sock, checks it, and takes it through the lifecycle checks.
func (r *runner) runCommand(ctx context.Context) error {
	root := r.cfg.Root
	if root == "" {
		dir, err := os.MkdirTemp("", "npconform")
		if err != nil {
			return fmt.Errorf("%w (set TMPDIR, or give a root dir)", err)
		}
		root, r.ownRoot = dir, true
	} else if err := refuseLiveKubelet(ctx, layout.KubeletSocket(root)); err != nil {
		return err
	}
	r.root = root
	var err error
	for _, d := range []string{layout.PluginsRegistryDirName, layout.DevicePluginsDirName} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o750); err != nil {
			return err
		}
	}
	dirs := r.cfg.AllowedDirs
	if len(dirs) == 0 {
		dirs = []string{root}
	}
	if r.confiner, err = unixsock.NewConfiner(dirs); err != nil {
		return err
	}
	r.kubelet = newKubelet(layout.DevicePluginsDir(root), r.cfg.Timeout, r.log)
	if err := r.kubelet.start(); err != nil {
		return err
	}
	if err := r.startAndRegister(ctx); err != nil {
		var nr notRegistered
		if !errors.As(err, &nr) {
			return err
		}
		r.record(CheckRegisterRequest, Fail, time.Time{}, "%v", err)
		r.record(CheckGetInfo, Fail, time.Time{}, "%v", err)
		r.skip("the plugin did not register", append(deviceChecks, CheckDriverService, CheckNotify, CheckKubeletRestart, CheckSocketRemoval, CheckSIGTERM)...)
		return nil
	}
	r.deviceChecks(ctx)
	r.checkOtherResources(ctx)
	if r.selected(CheckKubeletRestart) {
		r.checkKubeletRestart(ctx)
	}
	if r.selected(CheckSIGTERM) {
		r.checkSIGTERM(ctx)
	}
	if r.selected(CheckSocketRemoval) {
		r.checkSocketRemoval(ctx)
	}
	return nil
}

// refuseLiveKubelet fails when something answers on kubelet.sock: conform
// must not take a real kubelet's (or nodeplug's) place.
func refuseLiveKubelet(ctx context.Context, sock string) error {
	if !unixsock.IsSocket(sock) {
		return nil
	}
	var d net.Dialer
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := d.DialContext(cctx, "unix", sock)
	if err != nil {
		return nil
	}
	_ = conn.Close()
	return fmt.Errorf("%s answers: a kubelet or nodeplug's devicemanager serves it; conform will not replace it", sock)
}

// notRegistered: the started plugin did not register.
type notRegistered struct{ msg string }

func (e notRegistered) Error() string { return e.msg }

// startAndRegister starts the plugin (a new instance when one ran before,
// with the sockets it left removed) and waits for it to register, through
// kubelet.sock or plugins_registry, then connects as the kubelet does.
func (r *runner) startAndRegister(ctx context.Context) error {
	if r.proc != nil {
		r.proc.kill()
		r.sess.close()
		r.sess = nil
		r.kubelet.closeSessions(nil)
		for _, d := range []string{r.registryDir(), r.kubelet.dir} {
			removeSockets(d, r.kubelet.socket())
		}
	}
	n := r.kubelet.count()
	env := append([]string{"NODEPLUG_ROOT_DIR=" + r.root}, r.cfg.Env...)
	p, err := startProcess(Substitute(r.cfg.Command, r.root), env, r.cfg.PluginOutput)
	if err != nil {
		return err
	}
	r.proc = p
	var reg *registration
	var sock string
	found := poll(ctx, r.cfg.RegisterWait, func() bool {
		if reg, _ = r.kubelet.next(n); reg != nil {
			return true
		}
		sock = findSocket(r.registryDir())
		return sock != "" || !p.alive()
	})
	switch {
	case reg != nil:
		r.onRegister(reg)
	case sock != "":
		r.registerViaSocket(ctx, sock, false)
		r.skip("registers through plugins_registry", CheckRegisterRequest)
	case !found:
		return notRegistered{fmt.Sprintf("the plugin did not register within %s: no Register on kubelet.sock, no socket in plugins_registry", r.cfg.RegisterWait)}
	default:
		st, _ := p.exitState()
		return notRegistered{fmt.Sprintf("the plugin exited before it registered: %s", st)}
	}
	return nil
}

// onRegister takes a Register call on kubelet.sock as the registration.
func (r *runner) onRegister(reg *registration) {
	r.path = PathKubeletSock
	r.report.Plugin = reg.req.GetResourceName()
	r.skip("registers through kubelet.sock: the kubelet calls no GetInfo", CheckGetInfo, CheckDriverService, CheckNotify)
	req := reg.req
	what := fmt.Sprintf("Register(version %q, resource %q, endpoint %q)", req.GetVersion(), req.GetResourceName(), req.GetEndpoint())
	switch {
	case reg.ruleErr != nil:
		r.record(CheckRegisterRequest, Fail, reg.at, "%s: %v", what, reg.ruleErr)
		r.notDevice = "the kubelet refused the Register call"
		return
	case reg.dialErr != nil:
		r.record(CheckRegisterRequest, Fail, reg.at, "%s: %v", what, reg.dialErr)
		r.notDevice = "the kubelet could not dial the endpoint"
		return
	}
	r.sess = reg.sess
	if o := reg.sess.opts; reg.sess.optsErr == nil &&
		(req.GetOptions().GetPreStartRequired() != o.GetPreStartRequired() || req.GetOptions().GetGetPreferredAllocationAvailable() != o.GetGetPreferredAllocationAvailable()) {
		r.record(CheckRegisterRequest, Warn, reg.at, "%s: its options (%v) differ from GetDevicePluginOptions (%v); the kubelet uses the latter", what, req.GetOptions(), o)
		return
	}
	r.record(CheckRegisterRequest, Pass, reg.at, "%s accepted", what)
}

// findSocket returns the first socket under dir, as the kubelet's walk
// finds them (lexical order, entries starting with "." skipped).
func findSocket(dir string) string {
	found := ""
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || found != "" {
			return filepath.SkipDir
		}
		if path != dir && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type()&fs.ModeSocket != 0 {
			found = path
			return filepath.SkipAll
		}
		return nil
	})
	return found
}

// removeSockets removes the sockets under dir but keep.
func removeSockets(dir, keep string) {
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSocket != 0 && path != keep {
			_ = os.Remove(path)
		}
		return nil
	})
}

// ownSockets are the plugin's sockets: its registration socket and its
// endpoint.
func (r *runner) ownSockets() []string {
	var out []string
	if r.regSock != "" {
		out = append(out, r.regSock)
	}
	if r.sess != nil && r.sess.endpoint != r.regSock {
		out = append(out, r.sess.endpoint)
	}
	return out
}

// ensureRunning starts the plugin again when it is not running, or when
// it runs without its sockets; it reports whether it runs, registered.
func (r *runner) ensureRunning(ctx context.Context, check string) bool {
	ok := r.proc.alive() && (r.sess != nil || r.regSock != "")
	for _, s := range r.ownSockets() {
		ok = ok && unixsock.IsSocket(s)
	}
	if ok {
		return true
	}
	if err := r.startAndRegister(ctx); err != nil || (r.sess == nil && r.regSock == "") {
		r.record(check, Skip, time.Time{}, "the plugin could not be started again for this check: %v", err)
		return false
	}
	return true
}

// checkKubeletRestart does what a kubelet restart does to a plugin: the
// connection goes, every socket in device-plugins/ is removed and
// kubelet.sock is created again. A kubelet.sock plugin must Register
// again; a plugins_registry plugin must still answer on its socket and
// endpoint, as the kubelet's walk finds it.
func (r *runner) checkKubeletRestart(ctx context.Context) {
	if !r.ensureRunning(ctx, CheckKubeletRestart) {
		return
	}
	start := time.Now()
	n := r.kubelet.count()
	wasDevice := r.sess != nil
	r.sess.close()
	r.sess = nil
	r.kubelet.closeSessions(nil)
	r.kubelet.stop()
	if err := r.kubelet.cleanup(); err != nil {
		r.record(CheckKubeletRestart, Fail, start, "conform could not clean device-plugins/: %v", err)
		return
	}
	if err := r.kubelet.start(); err != nil {
		r.record(CheckKubeletRestart, Fail, start, "conform could not serve kubelet.sock again: %v", err)
		return
	}
	if r.path == PathKubeletSock {
		var others []string
		for _, o := range r.others {
			if o.path == PathKubeletSock {
				others = append(others, o.resourceName())
			}
		}
		reg, missing := r.waitRegistered(ctx, n, r.resourceName(), others, start.Add(r.cfg.RegisterWait))
		if len(missing) > 0 {
			r.record(CheckKubeletRestart, Fail, start, "no Register for %s within %s of kubelet.sock being re-created%s", strings.Join(missing, ", "), r.cfg.RegisterWait, r.exitNote())
			return
		}
		switch {
		case reg.ruleErr != nil:
			r.record(CheckKubeletRestart, Fail, start, "registered again, but the kubelet refuses it: %v", reg.ruleErr)
			return
		case reg.dialErr != nil:
			r.record(CheckKubeletRestart, Fail, start, "registered again, but its endpoint cannot be dialled: %v", reg.dialErr)
			return
		case reg.sess.optsErr != nil:
			r.sess = reg.sess
			r.record(CheckKubeletRestart, Fail, start, "registered again, but GetDevicePluginOptions failed: %v", reg.sess.optsErr)
			return
		}
		r.sess = reg.sess
		took := reg.at.Sub(start).Round(time.Millisecond)
		r.finishRestart(ctx, start, fmt.Sprintf("registered again %s after kubelet.sock was re-created", took))
		return
	}
	// plugins_registry: the kubelet's walk finds the socket; it must
	// answer, and the endpoint must serve (a swept endpoint must come back).
	var lastErr error
	ok := poll(ctx, r.cfg.RegisterWait, func() bool {
		info, conn, err := r.getInfo(ctx, r.regSock)
		if err != nil {
			lastErr = fmt.Errorf("GetInfo: %w", err)
			return !r.proc.alive()
		}
		_ = conn.Close()
		ep := info.GetEndpoint()
		if ep == "" {
			ep = r.regSock
		}
		if !wasDevice {
			return true
		}
		s, err := connect(ctx, ep, r.cfg.Timeout)
		if err != nil || s.optsErr != nil {
			if s != nil {
				lastErr = fmt.Errorf("endpoint %s: %w", ep, s.optsErr)
				s.close()
			} else {
				lastErr = err
			}
			return !r.proc.alive()
		}
		r.sess = s
		return true
	})
	if !ok || (r.sess == nil && wasDevice) {
		r.record(CheckKubeletRestart, Fail, start, "not registered again within %s: %v%s", r.cfg.RegisterWait, lastErr, r.exitNote())
		return
	}
	if r.sess == nil {
		r.record(CheckKubeletRestart, Pass, start, "its socket still answers GetInfo")
		return
	}
	r.finishRestart(ctx, start, "found again in plugins_registry: GetInfo and its endpoint answer")
}

// finishRestart opens ListAndWatch on the session registered after the
// restart and records kubelet-restart.
func (r *runner) finishRestart(ctx context.Context, start time.Time, what string) {
	r.sess.openStream()
	first, err := r.sess.stream.first(ctx, r.cfg.Timeout)
	if err != nil {
		r.record(CheckKubeletRestart, Fail, start, "%s, but ListAndWatch: %v", what, err)
		return
	}
	got, _ := r.firstWithDevices(ctx, first)
	r.record(CheckKubeletRestart, Pass, start, "%s; the new stream got %d devices", what, len(got.devices))
}

// checkSIGTERM sends SIGTERM: the plugin must exit, and should remove its
// sockets.
func (r *runner) checkSIGTERM(ctx context.Context) {
	if !r.ensureRunning(ctx, CheckSIGTERM) {
		return
	}
	socks := append(r.ownSockets(), r.otherSockets()...)
	start := time.Now()
	if err := r.proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		r.record(CheckSIGTERM, Fail, start, "cannot signal the plugin: %v", err)
		return
	}
	if !poll(ctx, r.cfg.Timeout, func() bool { return !r.proc.alive() }) {
		r.record(CheckSIGTERM, Fail, start, "still running %s after SIGTERM (killed)", r.cfg.Timeout)
		r.proc.kill()
		return
	}
	st, _ := r.proc.exitState()
	var left []string
	for _, s := range socks {
		if _, err := os.Lstat(s); err == nil {
			left = append(left, s)
		}
	}
	took := time.Since(start).Round(time.Millisecond)
	if len(left) > 0 {
		r.record(CheckSIGTERM, Warn, start, "exited (%s) after %s but left %s behind", st, took, strings.Join(left, ", "))
		return
	}
	r.record(CheckSIGTERM, Pass, start, "exited (%s) after %s and removed %s", st, took, strings.Join(socks, ", "))
}

// checkSocketRemoval removes the plugin's own socket and records what it
// does; only a crash fails.
func (r *runner) checkSocketRemoval(ctx context.Context) {
	if !r.ensureRunning(ctx, CheckSocketRemoval) {
		return
	}
	sock := r.regSock
	if sock == "" {
		sock = r.sess.endpoint
	}
	old, _, err := unixsock.Stat(sock)
	if err != nil {
		r.record(CheckSocketRemoval, Skip, time.Time{}, "cannot stat %s: %v", sock, err)
		return
	}
	n := r.kubelet.count()
	start := time.Now()
	if err := os.Remove(sock); err != nil {
		r.record(CheckSocketRemoval, Skip, time.Time{}, "cannot remove %s: %v", sock, err)
		return
	}
	recreated := func() bool {
		id, _, err := unixsock.Stat(sock)
		return err == nil && id != old
	}
	// A crash shows within --observe; a re-creation may take longer (a
	// plugin that polls for its socket every few seconds), so it is
	// waited for up to --recreate-wait.
	wait := max(r.cfg.Observe, r.cfg.RecreateWait)
	poll(ctx, wait, func() bool { return !r.proc.alive() || recreated() })
	took := time.Since(start).Round(time.Millisecond)
	if st, done := r.proc.exitState(); done {
		if r.proc.exitCode() != 0 {
			r.record(CheckSocketRemoval, Fail, start, "crashed %s after %s was removed: %s", took, sock, st)
			return
		}
		r.record(CheckSocketRemoval, Pass, start, "exited cleanly %s after %s was removed (a supervisor starts it again)", took, sock)
		return
	}
	if recreated() {
		again := ""
		if r.kubelet.count() > n {
			again = " and registered again"
		}
		r.record(CheckSocketRemoval, Pass, start, "re-created %s after %s%s", sock, took, again)
		return
	}
	what := "the kubelet has deregistered it until the socket is created again"
	if r.path == PathKubeletSock {
		what = "its open stream lives on, but nothing can connect to it until it creates the socket again or restarts"
	}
	r.record(CheckSocketRemoval, Pass, start, "kept running, and did not re-create %s within %s (--recreate-wait): %s", sock, wait, what)
}
