package conform

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// The kubelet's own timeouts, used where it has one.
const (
	// GetInfoTimeout bounds GetInfo (operation_generator.go).
	GetInfoTimeout = time.Second
	// NotifyTimeout bounds NotifyRegistrationStatus (operation_generator.go).
	NotifyTimeout = 5 * time.Second
	// PreStartTimeout bounds PreStartContainer
	// (v1beta1.KubeletPreStartContainerRPCTimeoutInSecs).
	PreStartTimeout = 30 * time.Second
)

// Defaults of Config.
const (
	// DefaultTimeout bounds a call where the kubelet has no timeout of its
	// own (it is also the kubelet's dial timeout).
	DefaultTimeout = 10 * time.Second
	// DefaultRegisterWait bounds the wait for a started plugin to register,
	// and to register again after kubelet.sock is re-created: the upstream
	// Stub waits 10 s before it restarts its server.
	DefaultRegisterWait = 30 * time.Second
	// DefaultObserve is how long conform watches for something that should
	// not happen: a health flap, a new stream ending after a reconnect, a
	// crash after the socket is removed.
	DefaultObserve = 5 * time.Second
	// DefaultRecreateWait is how long socket-removal waits for the plugin
	// to create its removed socket again (a plugin that polls for it
	// every few seconds re-creates it after --observe).
	DefaultRecreateWait = 15 * time.Second
)

// Registration paths, as Report.Path names them.
const (
	PathRegistry     = "plugins_registry"
	PathKubeletSock  = "kubelet.sock"
	PathDeviceSocket = "device plugin socket"
	// PathRegistrationSocket: a socket given directly that answers GetInfo
	// but does not lie in a plugins_registry directory.
	PathRegistrationSocket = "registration socket"
)

// Config says what to check and how.
type Config struct {
	// Socket is the plugin's socket: a registration socket (of any plugin
	// type) or a device plugin socket. Exactly one of Socket and Command.
	Socket string
	// Command starts the plugin (argv); conform then serves its own
	// kubelet.sock and plugins_registry in a temporary root dir and runs
	// the lifecycle checks too. "{root}", "{kubelet-sock}" and
	// "{plugins-registry}" in the arguments are replaced by those paths,
	// and NODEPLUG_ROOT_DIR is set to the root dir.
	Command []string
	// Env is added to the started plugin's environment (KEY=VALUE).
	Env []string
	// Root, when set, is the root dir conform serves kubelet.sock and
	// plugins_registry under instead of a new temporary one: for plugins
	// that hard-code /var/lib/kubelet. Conform refuses it when a kubelet
	// (or nodeplug's devicemanager) answers on its kubelet.sock, and
	// leaves the directory in place.
	Root string
	// AllowedDirs are where endpoints may be (nodeplug's
	// --allowed-endpoint-dir); an endpoint elsewhere is a warn. Default:
	// the root dir (with Socket: the parent of the socket's directory).
	AllowedDirs []string

	Selection

	// Timeout bounds calls for which the kubelet has no timeout.
	Timeout time.Duration
	// RegisterWait bounds the wait for the started plugin to register.
	RegisterWait time.Duration
	// Resources is how many resources the started plugin serves, each
	// registered on its own: conform waits (within RegisterWait) for that
	// many before it checks the others. 0: the others are those that
	// registered while the first was checked.
	Resources int
	// Observe is how long conform watches for what must not happen.
	Observe time.Duration
	// RecreateWait is how long socket-removal waits for a re-created
	// socket (at least Observe).
	RecreateWait time.Duration

	// PluginOutput, when set, receives the started plugin's output as it
	// comes (the report keeps its tail either way).
	PluginOutput io.Writer
	// Log receives conform's own log; nil discards it.
	Log *slog.Logger
}

func (c *Config) defaults() error {
	if (c.Socket == "") == (len(c.Command) == 0) {
		return errors.New("give either a socket or a command to start")
	}
	if c.Socket != "" && !filepath.IsAbs(c.Socket) {
		abs, err := filepath.Abs(c.Socket)
		if err != nil {
			return err
		}
		c.Socket = abs
	}
	if err := c.Validate(); err != nil {
		return err
	}
	if c.Resources < 0 {
		return fmt.Errorf("resources %d: give how many resources the plugin serves, or 0", c.Resources)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.RegisterWait <= 0 {
		c.RegisterWait = DefaultRegisterWait
	}
	if c.Observe <= 0 {
		c.Observe = DefaultObserve
	}
	if c.RecreateWait <= 0 {
		c.RecreateWait = DefaultRecreateWait
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// runner holds the state of one run.
type runner struct {
	cfg      Config
	log      *slog.Logger
	report   *Report
	results  map[string]Result
	confiner *unixsock.Confiner

	// The plugin as the kubelet sees it.
	path      string   // PathRegistry, PathKubeletSock or PathDeviceSocket
	regSock   string   // the plugins_registry socket (PathRegistry, or Socket answering GetInfo)
	sess      *session // the device plugin endpoint, nil when not a device plugin or unreachable
	devices   deviceSet
	notDevice string // why device checks do not apply

	// Lifecycle mode.
	root    string
	ownRoot bool // root is conform's temporary directory
	kubelet *kubelet
	proc    *process

	// others are the plugin's other resources (resources.go).
	others []*runner
}

// Run checks the plugin Config names and returns the report. An error means
// the run could not be made (bad configuration, a command that cannot be
// started); a plugin that breaks rules gives a report with failures.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, log: cfg.Log, results: map[string]Result{}, report: &Report{}}
	defer r.closeAll()
	var err error
	if cfg.Socket != "" {
		r.report.Target = cfg.Socket
		err = r.runSocket(ctx)
	} else {
		r.report.Target = strings.Join(cfg.Command, " ")
		err = r.runCommand(ctx)
	}
	if err != nil {
		return nil, err
	}
	r.finish()
	return r.report, nil
}

// selected reports whether the check named name is reported.
func (r *runner) selected(name string) bool { return r.cfg.Selected(name) }

// record sets the result of a check (the first result of a check stands).
func (r *runner) record(name string, st Status, start time.Time, format string, a ...any) {
	if _, done := r.results[name]; done {
		return
	}
	c, _ := Lookup(name)
	var took time.Duration
	if !start.IsZero() {
		took = time.Since(start)
	}
	r.results[name] = Result{Check: c, Status: st, Detail: fmt.Sprintf(format, a...), Elapsed: took}
	r.log.Info("check", "name", name, "status", st, "detail", r.results[name].Detail)
}

// skip records every named check as skipped for the same reason.
func (r *runner) skip(reason string, names ...string) {
	for _, n := range names {
		r.record(n, Skip, time.Time{}, "%s", reason)
	}
}

// finish fills in the checks that did not run, in catalogue order, keeping
// only the selected ones.
func (r *runner) finish() {
	for _, c := range Catalogue {
		if !r.selected(c.Name) {
			continue
		}
		res, ok := r.results[c.Name]
		if !ok {
			reason := "not run"
			if c.Lifecycle && r.proc == nil {
				reason = "needs conform to start the plugin (nodeplugctl conform -- CMD ARGS)"
			}
			res = Result{Check: c, Status: Skip, Detail: reason}
		}
		r.report.Results = append(r.report.Results, r.merged(c, res))
	}
	r.report.Path = r.path
	r.report.Resources = r.resources()
	if r.proc != nil && r.report.Failed() {
		r.report.PluginOutput = r.proc.output()
	}
}

func (r *runner) closeAll() {
	r.sess.close()
	for _, o := range r.others {
		o.sess.close()
	}
	if r.kubelet != nil {
		r.kubelet.closeSessions(r.sess)
		r.kubelet.stop()
	}
	if r.proc != nil {
		r.proc.kill()
	}
	if r.ownRoot {
		_ = os.RemoveAll(r.root)
	}
}

// deviceChecks are the checks that need a device plugin endpoint.
var deviceChecks = []string{
	CheckOptions, CheckFirstResponse, CheckDeviceIDs, CheckHealth, CheckTopology, CheckHealthFlap,
	CheckAllocate, CheckAllocateUnknown, CheckPreferred, CheckPreStart, CheckConcurrentAllocate, CheckReconnect,
}

// runSocket checks a plugin that is already running at Config.Socket.
func (r *runner) runSocket(ctx context.Context) error {
	dirs := r.cfg.AllowedDirs
	if len(dirs) == 0 {
		dirs = []string{filepath.Dir(filepath.Dir(r.cfg.Socket))}
	}
	var err error
	if r.confiner, err = unixsock.NewConfiner(dirs); err != nil {
		return err
	}
	if !unixsock.IsSocket(r.cfg.Socket) {
		return fmt.Errorf("%s is not a socket", r.cfg.Socket)
	}
	r.skip("registration through kubelet.sock needs conform to start the plugin (-- CMD ARGS)", CheckRegisterRequest)
	r.registerViaSocket(ctx, r.cfg.Socket, true)
	r.deviceChecks(ctx)
	return nil
}

// deviceChecks runs the checks of the device plugin API on r.sess.
func (r *runner) deviceChecks(ctx context.Context) {
	if r.sess == nil {
		reason := r.notDevice
		if reason == "" {
			reason = "no device plugin endpoint to check"
		}
		r.skip(reason, deviceChecks...)
		return
	}
	r.checkOptions()
	if r.sess.optsErr != nil {
		r.skip("GetDevicePluginOptions failed: the kubelet does not use the plugin", deviceChecks...)
		return
	}
	if !r.checkStream(ctx) {
		return
	}
	r.checkAllocate(ctx)
	r.checkAllocateUnknown(ctx)
	r.checkPreferred(ctx)
	r.checkPreStart(ctx)
	r.checkConcurrentAllocate(ctx)
	if r.selected(CheckHealthFlap) {
		r.finishFlap(ctx)
	}
	if r.selected(CheckReconnect) {
		r.checkReconnect(ctx)
	}
}
