package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/clock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/reconciler"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

var spans = tracetest.NewSpanRecorder()

func TestMain(m *testing.M) {
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	otel.SetTextMapPropagator(telemetry.Propagator)
	goleak.VerifyTestMain(m)
}

func testLog() *slog.Logger {
	if os.Getenv("NODEPLUG_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// env is a reconciler service running in-process against a fake watcher and
// a fake devicemanager, both served over real Unix sockets.
type env struct {
	t       *testing.T
	root    string
	plugins string
	w       *fakeWatcher
	dm      *fakeDM
	clk     *clock.Fake
	s       *service
	cancel  context.CancelFunc
	done    chan struct{}
	// configure, when set, changes the service's configuration.
	configure func(*config)
}

func newEnv(t *testing.T) *env { return newEnvWith(t, nil) }

// newEnvWith is newEnv with configure applied to the service's
// configuration.
func newEnvWith(t *testing.T, configure func(*config)) *env {
	root, plugins := tempRoot(t)
	e := &env{t: t, root: root, plugins: plugins, clk: clock.NewFake(time.Unix(1_000_000, 0)), configure: configure}
	e.w = newFakeWatcher(t, filepath.Join(root, "watcher.sock"))
	e.dm = newFakeDM(t, filepath.Join(root, "dm.sock"))
	e.start()
	t.Cleanup(e.stop)
	return e
}

// start runs a (new) reconciler.
func (e *env) start() {
	e.t.Helper()
	cfg := config{
		WatcherAddr:       filepath.Join(e.root, "watcher.sock"),
		DeviceManagerAddr: filepath.Join(e.root, "dm.sock"),
		AllowedDirs:       []string{e.root},
		Log:               testLog(),
		Clock:             e.clk,
		// Kept across the env's restarts, as in the root dir.
		RegistrationsFile: filepath.Join(e.root, "registrations.json"),
	}
	if e.configure != nil {
		e.configure(&cfg)
	}
	// The fake devicemanager serves DRAService too, standing for the
	// dramanager unless the test says otherwise.
	if cfg.DRAManagerAddr == "" {
		cfg.DRAManagerAddr = cfg.DeviceManagerAddr
	}
	s, err := newService(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.s, e.cancel, e.done = s, cancel, make(chan struct{})
	streams := e.w.Streams()
	lists, draLists := e.dm.Lists()
	// The first snapshot makes the reconciler look for orphans: where it
	// looks at e.dm, its lists are answered before the test registers
	// anything, so a list that holds a registration the test makes
	// meanwhile cannot come back as a deregistration the test did not ask
	// for.
	dmAddr := filepath.Join(e.root, "dm.sock")
	askDM, askDRA := cfg.DeviceManagerAddr == dmAddr, cfg.DRAManagerAddr == dmAddr
	defer testutil.WaitFor(e.t, "the reconciler's first snapshot and its look for orphans", func() bool {
		l, dl := e.dm.Lists()
		return e.w.Streams() > streams && s.loop.Synced() && (!askDM || l > lists) && (!askDRA || dl > draLists)
	})
	go func() {
		defer close(e.done)
		if err := s.run(ctx); err != nil {
			e.t.Errorf("run: %v", err)
		}
	}()
}

// stop stops the reconciler (as SIGTERM would: nothing is deregistered).
func (e *env) stop() {
	if e.cancel == nil {
		return
	}
	e.cancel()
	<-e.done
	e.cancel = nil
}

func (e *env) sock(name string) string { return filepath.Join(e.plugins, name+".sock") }

// plugin starts a test plugin at plugins_registry/<file>.sock.
func (e *env) plugin(file string, info testplugin.Info, opts ...testplugin.Options) *testplugin.Plugin {
	e.t.Helper()
	p, err := testplugin.Start(e.sock(file), info, opts...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Stop)
	return p
}

func (e *env) status(path string) (status.PluginStatus, bool) {
	return e.s.status.Get(path)
}

// waitState waits until path's status satisfies cond and returns it.
func (e *env) waitState(path string, what string, cond func(s status.PluginStatus) bool) status.PluginStatus {
	e.t.Helper()
	var st status.PluginStatus
	testutil.WaitFor(e.t, path+" "+what, func() bool {
		var ok bool
		st, ok = e.status(path)
		return ok && cond(st)
	})
	return st
}

func (e *env) waitRegistered(path string) status.PluginStatus {
	e.t.Helper()
	return e.waitState(path, "registered", func(s status.PluginStatus) bool { return s.State == status.StateRegistered })
}

// createdRegistered reports each plugin's socket created and waits until
// it is registered.
func (e *env) createdRegistered(ps ...*testplugin.Plugin) {
	e.t.Helper()
	for _, p := range ps {
		e.w.Created(e.t, p.Path())
		e.waitRegistered(p.Path())
	}
}

func (e *env) waitFailed(path string, failures int) status.PluginStatus {
	e.t.Helper()
	return e.waitState(path, "failed", func(s status.PluginStatus) bool {
		return s.State == status.StateFailed && s.Failures == failures
	})
}

func (e *env) waitGone(path string) {
	e.t.Helper()
	testutil.WaitFor(e.t, path+" forgotten", func() bool {
		_, ok := e.status(path)
		_, inASW := e.s.loop.ASW().Get(path)
		return !ok && !inASW
	})
}

// expireGetInfo ends the GetInfo budget of the one registration attempt
// waiting on it: it waits until exactly one budget is running (a stale
// socket's refused connection is retried until then, a hanging GetInfo
// waits until then), then moves the clock past it.
func (e *env) expireGetInfo() {
	e.t.Helper()
	testutil.WaitFor(e.t, "a GetInfo budget running", func() bool { return e.clk.Due(reconciler.DefaultGetInfoTimeout) == 1 })
	e.clk.Advance(reconciler.DefaultGetInfoTimeout)
}

// advanceBackoff moves the clock past the first backoff once the retry's
// timer is armed: a failed attempt is published before the executor arms
// its retry, so advancing before then would leave the retry waiting for a
// time that never comes.
func (e *env) advanceBackoff() {
	e.t.Helper()
	testutil.WaitFor(e.t, "a retry armed within the first backoff", func() bool { return e.clk.Due(executor.InitialBackoff) > 0 })
	e.clk.Advance(executor.InitialBackoff)
}

func waitCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	t.Cleanup(cancel)
	return ctx
}

func devicePlugin(name string) testplugin.Info {
	return testplugin.Info{Type: "DevicePlugin", Name: name, Versions: []string{"v1beta1"}}
}

func draPlugin(name string) testplugin.Info {
	return testplugin.Info{Type: "DRAPlugin", Name: name, Versions: []string{"v1.DRAPlugin"}}
}
