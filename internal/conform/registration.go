package conform

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// finding is one problem a check found; the worst status decides.
type finding struct {
	status Status
	text   string
}

func worst(fs []finding) Status {
	st := Pass
	for _, f := range fs {
		switch {
		case f.status == Fail:
			st = Fail
		case f.status == Warn && st == Pass:
			st = Warn
		}
	}
	return st
}

// failTexts joins the texts of the failing findings.
func failTexts(fs []finding) string {
	var out []string
	for _, f := range fs {
		if f.status == Fail {
			out = append(out, f.text)
		}
	}
	return strings.Join(out, "; ")
}

func texts(fs []finding) string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.text
	}
	return strings.Join(out, "; ")
}

// getInfo dials sock and calls GetInfo as the kubelet does: a blocking dial
// (Timeout), then the call with a 1 s timeout.
func (r *runner) getInfo(ctx context.Context, sock string) (*registerapi.PluginInfo, *grpc.ClientConn, error) {
	conn, err := rpcutil.DialPlugin(sock)
	if err != nil {
		return nil, nil, err
	}
	if err := waitReady(ctx, conn, r.cfg.Timeout); err != nil {
		_ = conn.Close()
		return nil, nil, fmt.Errorf("dial %s: %w", sock, err)
	}
	cctx, cancel := context.WithTimeout(ctx, GetInfoTimeout)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(cctx, &registerapi.InfoRequest{})
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return info, conn, nil
}

// registerViaSocket registers the plugin at sock, a plugins_registry socket
// (or, when direct, a socket given on the command line that may also be a
// bare device plugin socket), as the kubelet's plugin manager does: GetInfo,
// validation for the type, the handler's connect for a device plugin, then
// NotifyRegistrationStatus. It records getinfo and notify and sets r.sess.
func (r *runner) registerViaSocket(ctx context.Context, sock string, direct bool) {
	start := time.Now()
	info, conn, err := r.getInfo(ctx, sock)
	if err != nil {
		if direct && status.Code(err) == codes.Unimplemented {
			r.path = PathDeviceSocket
			r.skip("the socket serves no pluginregistration.Registration: a device plugin socket (it registers on kubelet.sock)", CheckGetInfo, CheckDriverService, CheckNotify)
			r.connectDevice(ctx, sock)
			return
		}
		r.path = PathRegistry
		r.record(CheckGetInfo, Fail, start, "GetInfo at %s failed: %v", sock, err)
		r.skip("GetInfo failed: the kubelet registers nothing and retries with backoff", CheckDriverService, CheckNotify)
		r.notDevice = "GetInfo failed: the kubelet never connects to the plugin"
		return
	}
	defer conn.Close()
	r.path, r.regSock = PathRegistry, sock
	if direct && !strings.Contains(sock, "/plugins_registry/") {
		r.path = PathRegistrationSocket
	}
	r.report.Plugin = info.GetName()
	endpoint := info.GetEndpoint()
	if endpoint == "" {
		endpoint = sock
	}
	fs, validateErr := r.validateInfo(ctx, info, endpoint)
	st := worst(fs)
	summary := fmt.Sprintf("%s %q, versions %q, endpoint %q", info.GetType(), info.GetName(), info.GetSupportedVersions(), info.GetEndpoint())
	if len(fs) == 0 {
		r.record(CheckGetInfo, Pass, start, "%s", summary)
	} else {
		r.record(CheckGetInfo, st, start, "%s: %s", summary, texts(fs))
	}

	// The handler's Register, then the notification of the outcome: a
	// failed check is a failed registration, told to the plugin.
	var regErr error
	if info.GetType() != registerapi.DevicePlugin {
		r.notDevice = fmt.Sprintf("a %s, not a device plugin", bounds.Quote(info.GetType()))
	}
	isDriver := info.GetType() == registerapi.CSIPlugin || info.GetType() == registerapi.DRAPlugin
	switch {
	case validateErr != nil:
		regErr = validateErr
	case st == Fail:
		regErr = fmt.Errorf("RegisterPlugin error -- plugin registration failed with err: %s", failTexts(fs))
	}
	switch {
	case info.GetType() == registerapi.DevicePlugin:
		r.skip("a device plugin: the kubelet's device plugin handler calls GetDevicePluginOptions (options)", CheckDriverService)
	case !isDriver:
		r.skip("no handler for the plugin's type", CheckDriverService)
	case regErr != nil:
		r.skip("getinfo failed: the kubelet calls no driver service", CheckDriverService)
	default:
		regErr = r.checkDriverService(ctx, info, endpoint)
	}
	switch {
	case regErr != nil:
	case info.GetType() == registerapi.DevicePlugin:
		r.connectDevice(ctx, endpoint)
		switch {
		case r.sess == nil:
			regErr = fmt.Errorf("RegisterPlugin error -- plugin registration failed with err: cannot dial %s", endpoint)
		case r.sess.optsErr != nil:
			regErr = fmt.Errorf("RegisterPlugin error -- plugin registration failed with err: failed to get device plugin options: %v", r.sess.optsErr)
		}
	}
	if info.GetType() == registerapi.DevicePlugin && r.sess == nil && r.notDevice == "" {
		r.notDevice = "the kubelet rejected the registration: it never connects to the endpoint"
	}
	r.notify(ctx, conn, regErr)
}

// validateInfo applies the kubelet's rules for the plugin's type (from
// pkg/kubeletrules) and nodeplug's bounds and endpoint rules. validateErr is
// what the kubelet would tell the plugin, nil when it accepts it.
func (r *runner) validateInfo(ctx context.Context, info *registerapi.PluginInfo, endpoint string) (fs []finding, validateErr error) {
	fail := func(err error) {
		fs = append(fs, finding{Fail, err.Error()})
		if validateErr == nil {
			validateErr = err
		}
	}
	name, versions := info.GetName(), info.GetSupportedVersions()
	switch info.GetType() {
	case registerapi.DevicePlugin:
		if err := kubeletrules.ValidatePluginWatcher(name, versions); err != nil {
			fail(fmt.Errorf("RegisterPlugin error -- plugin validation failed with err: %w", err))
		}
	case registerapi.CSIPlugin:
		if name == "" {
			fail(errors.New("RegisterPlugin error -- plugin validation failed with err: empty CSI driver name"))
		}
		if _, err := kubeletrules.HighestCSIVersion("ValidatePlugin", name, versions); err != nil {
			fail(fmt.Errorf("RegisterPlugin error -- plugin validation failed with err: %w", err))
		}
	case registerapi.DRAPlugin:
		if name == "" {
			fail(fmt.Errorf("RegisterPlugin error -- plugin validation failed with err: DRA driver plugin at endpoint %s has an empty driver name", endpoint))
		}
		if _, err := kubeletrules.ChooseDRAService(versions); err != nil {
			fail(fmt.Errorf("RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC versions of DRA driver plugin %s at endpoint %s: %w", name, endpoint, err))
		}
	default:
		fail(fmt.Errorf("RegisterPlugin error -- no handler registered for plugin type: %s", bounds.Quote(info.GetType())))
		return fs, validateErr
	}
	if name != "" {
		if err := bounds.Name("plugin name", name); err != nil {
			fs = append(fs, finding{Fail, err.Error()})
		}
	}
	fs = append(fs, r.checkEndpoint(ctx, endpoint)...)
	return fs, validateErr
}

// checkEndpoint checks the endpoint a plugin names: absolute, no "..", a
// socket (waited for as long as the kubelet's dial waits), inside the
// allowed directories (outside is a warn: the kubelet dials it, nodeplug
// does not).
func (r *runner) checkEndpoint(ctx context.Context, endpoint string) []finding {
	if !filepath.IsAbs(endpoint) {
		return []finding{{Fail, fmt.Sprintf("endpoint %s is not an absolute path", bounds.Quote(endpoint))}}
	}
	if slices.Contains(strings.Split(endpoint, "/"), "..") {
		return []finding{{Fail, fmt.Sprintf("endpoint %s contains \"..\"", bounds.Quote(endpoint))}}
	}
	if len(endpoint) > unixsock.MaxPathLen {
		return []finding{{Fail, fmt.Sprintf("endpoint %s is longer than the %d bytes of a Unix socket address", bounds.Quote(endpoint), unixsock.MaxPathLen)}}
	}
	if !waitSocket(ctx, endpoint, r.cfg.Timeout) {
		return []finding{{Fail, fmt.Sprintf("endpoint %s is not a socket (waited %s, as the kubelet's dial does)", bounds.Quote(endpoint), r.cfg.Timeout)}}
	}
	if _, err := r.confiner.Resolve(endpoint); err != nil {
		return []finding{{Warn, fmt.Sprintf("nodeplug does not dial it: %v (--allowed-endpoint-dir; the kubelet dials any path)", err)}}
	}
	return nil
}

// connectDevice connects to a device plugin endpoint as the kubelet's
// device plugin handler does.
func (r *runner) connectDevice(ctx context.Context, endpoint string) {
	s, err := connect(ctx, endpoint, r.cfg.Timeout)
	if err != nil {
		r.notDevice = err.Error()
		return
	}
	r.sess = s
}

// notify tells the plugin the outcome with the kubelet's 5 s timeout and
// records the notify check.
func (r *runner) notify(ctx context.Context, conn *grpc.ClientConn, regErr error) {
	start := time.Now()
	st := &registerapi.RegistrationStatus{PluginRegistered: regErr == nil}
	if regErr != nil {
		st.Error = regErr.Error()
	}
	cctx, cancel := context.WithTimeout(ctx, NotifyTimeout)
	defer cancel()
	_, err := registerapi.NewRegistrationClient(conn).NotifyRegistrationStatus(cctx, st)
	switch {
	case err != nil:
		r.record(CheckNotify, Fail, start, "NotifyRegistrationStatus(registered=%t) failed: %v", st.PluginRegistered, err)
	case regErr != nil:
		r.record(CheckNotify, Pass, start, "answered NotifyRegistrationStatus(registered=false, %q)", st.Error)
	default:
		r.record(CheckNotify, Pass, start, "answered NotifyRegistrationStatus(registered=true)")
	}
}

// waitSocket waits at most timeout for path to be a socket.
func waitSocket(ctx context.Context, path string, timeout time.Duration) bool {
	return poll(ctx, timeout, func() bool { return unixsock.IsSocket(path) })
}

// poll looks at cond with a delay that doubles from 1 ms to 50 ms, until it
// holds (true) or timeout or ctx ends (false).
func poll(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		if cond() {
			return true
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return cond()
		case <-deadline.C:
			t.Stop()
			return cond()
		case <-t.C:
		}
	}
}

// waitReady waits at most timeout for conn to connect, as the kubelet's
// blocking dial does.
func waitReady(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn.Connect()
	for {
		s := conn.GetState()
		if s == connectivity.Ready {
			return nil
		}
		if !conn.WaitForStateChange(cctx, s) {
			return fmt.Errorf("not ready within %s (%s)", timeout, s)
		}
	}
}
