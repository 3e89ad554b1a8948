package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/cdispec"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/containerstart"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// spans records every span of the tests.
var spans = tracetest.NewSpanRecorder()

func TestMain(m *testing.M) {
	// The SDK, as every binary installs it, so trace IDs exist; spans are
	// recorded for the tracing tests.
	otel.SetTextMapPropagator(telemetry.Propagator)
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
	goleak.VerifyTestMain(m)
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("NODEPLUG_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// logBuffer keeps what a logger wrote, for tests that check the log.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// logger returns a logger that writes, at info level and above, to the
// buffer (and to testLogger).
func (b *logBuffer) logger(t testing.TB) *slog.Logger {
	h := slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelInfo})
	return slog.New(slog.NewMultiHandler(h, testLogger(t).Handler()))
}

// has reports whether a line of the log has message msg and every attr,
// as "key=value" (the value quoted as the text handler quotes it).
func (b *logBuffer) has(msg string, attrs ...string) bool {
	for line := range strings.Lines(b.String()) {
		if !strings.Contains(line, "msg="+quoteLog(msg)) {
			continue
		}
		ok := true
		for i := 0; i+1 < len(attrs); i += 2 {
			if !strings.Contains(line, " "+attrs[i]+"="+quoteLog(attrs[i+1])) {
				ok = false
			}
		}
		if ok {
			return true
		}
	}
	return false
}

// quoteLog renders a value as slog's text handler does.
func quoteLog(v string) string {
	var b bytes.Buffer
	slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
		if a.Key == slog.TimeKey || a.Key == slog.LevelKey || a.Key == slog.MessageKey {
			return slog.Attr{}
		}
		return a
	}})).Info("", "v", v)
	return strings.TrimSuffix(strings.TrimPrefix(b.String(), "v="), "\n")
}

// env is a devicemanager driven in-process through its gRPC API over a real
// Unix socket, with kubelet.sock served beside it, put together as main.go
// does (main's runtime would also install its own tracer provider, which
// the tracing tests replace).
type env struct {
	t       testing.TB
	root    string
	dpDir   string
	regDir  string
	grace   time.Duration
	m       *manager.Manager
	metrics *prometheus.Registry
	logs    *logBuffer // the manager's and kubelet.sock's log
	svc     *Service
	// watchLimits are the manager's (set before start).
	watchLimits stream.Limits
	// endpointWait is the manager's wait for a missing endpoint file
	// (set before start): short, unless a test is about that wait.
	endpointWait time.Duration
	client       dmv1.DeviceManagerServiceClient
	stop         func()
	stopped      bool
}

func newEnv(t testing.TB, grace time.Duration) *env {
	t.Helper()
	return newEnvWatch(t, grace, stream.Limits{})
}

// newEnvWatch is newEnv with the manager's Watch (WatchResources) bounded by
// limits.
func newEnvWatch(t testing.TB, grace time.Duration, limits stream.Limits) *env {
	t.Helper()
	return newEnvConfig(t, grace, limits, testEndpointWait)
}

// testEndpointWait is how long the managers of the tests wait for a missing
// endpoint file, unless a test is about that wait.
const testEndpointWait = 200 * time.Millisecond

// newEnvConfig is newEnvWatch with the manager waiting up to endpointWait
// for a missing endpoint file.
func newEnvConfig(t testing.TB, grace time.Duration, limits stream.Limits, endpointWait time.Duration) *env {
	t.Helper()
	root := testutil.TempDir(t)
	e := &env{t: t, root: root, dpDir: filepath.Join(root, "device-plugins"), regDir: filepath.Join(root, "plugins_registry"), grace: grace,
		logs: &logBuffer{}, watchLimits: limits, endpointWait: endpointWait}
	if err := os.MkdirAll(e.regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	e.start()
	t.Cleanup(e.shutdown)
	return e
}

// serve serves a gRPC server built by register on a new socket at path
// until the returned stop.
func serve(t testing.TB, path string, register func(*grpc.Server)) (stop func()) {
	t.Helper()
	lis, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := rpcutil.NewServer(testLogger(t))
	register(srv)
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	return func() {
		srv.Stop()
		<-served
	}
}

func (e *env) start() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e.metrics = prometheus.NewRegistry()
	specs, err := cdispec.New(cdispec.Config{Dir: e.cdiDir(), SearchDirs: []string{e.cdiExtraDir()}, Log: e.logs.logger(e.t)})
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	m, err := manager.Open(ctx, manager.Config{
		DevicePluginsDir: e.dpDir, AllowedDirs: []string{e.root}, GracePeriod: e.grace, EndpointWait: e.endpointWait, WatchLimits: e.watchLimits,
		Store: store.New(e.dpDir, store.Options{}), Log: e.logs.logger(e.t), Registerer: e.metrics, Specs: specs,
	})
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		if err := m.Run(ctx); err != nil {
			e.t.Errorf("manager run: %v", err)
		}
	}()
	stopAPI := serve(e.t, filepath.Join(e.root, "dm.sock"), func(s *grpc.Server) {
		e.svc = NewService(m).WithStarter(containerstart.New(m, nil, specs))
		dmv1.RegisterDeviceManagerServiceServer(s, e.svc)
	})
	stopKubelet := serve(e.t, e.kubeletSock(), func(s *grpc.Server) {
		pluginapi.RegisterRegistrationServer(s, NewRegistration(m, e.dpDir, e.logs.logger(e.t)))
	})
	conn, err := rpcutil.DialPeer(filepath.Join(e.root, "dm.sock"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.m, e.client, e.stopped = m, dmv1.NewDeviceManagerServiceClient(conn), false
	e.stop = func() {
		_ = conn.Close()
		stopAPI()
		stopKubelet()
		cancel()
		<-ran
	}
}

// cdiDir is where the manager writes its CDI specs; cdiExtraDir is the
// other directory names resolve in (searched first).
func (e *env) cdiDir() string      { return filepath.Join(e.root, "cdi") }
func (e *env) cdiExtraDir() string { return filepath.Join(e.root, "cdi-extra") }

func (e *env) shutdown() {
	if !e.stopped {
		e.stopped = true
		e.stop()
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	t.Cleanup(cancel)
	return ctx
}

// plugin starts a device plugin with its socket in plugins_registry, or in
// device-plugins when legacy is set.
func (e *env) plugin(name string, opts sampleplugin.Options, legacy bool) *sampleplugin.Plugin {
	e.t.Helper()
	dir := e.regDir
	if legacy {
		dir = e.dpDir
	}
	opts.SocketPath = filepath.Join(dir, name+".sock")
	if opts.Log == nil {
		opts.Log = testLogger(e.t)
	}
	p := plugintest.Start(e.t, opts)
	return p
}

// register registers p through RegisterPlugin, as the reconciler does.
func (e *env) register(p *sampleplugin.Plugin) (*dmv1.RegisterPluginResponse, error) {
	return e.client.RegisterPlugin(ctxT(e.t), &dmv1.RegisterPluginRequest{
		ResourceName: p.Resource(), Endpoint: p.SocketPath(), Versions: []string{pluginapi.Version},
		SocketPath: p.SocketPath(), Generation: testutil.Generation(e.t, p.SocketPath()),
	})
}

func (e *env) mustRegister(p *sampleplugin.Plugin) {
	e.t.Helper()
	if _, err := e.register(p); err != nil {
		e.t.Fatalf("RegisterPlugin %s: %v", p.SocketPath(), err)
	}
}

func (e *env) kubeletSock() string { return manager.KubeletSocketPath(e.dpDir) }

func (e *env) resource(name string) *dmv1.Resource {
	e.t.Helper()
	resp, err := e.client.ListResources(ctxT(e.t), &dmv1.ListResourcesRequest{})
	if err != nil {
		e.t.Fatalf("ListResources: %v", err)
	}
	for _, r := range resp.GetResources() {
		if r.GetName() == name {
			return r
		}
	}
	return nil
}

// waitResource waits until cond holds for the named resource (nil when
// absent).
func (e *env) waitResource(name, what string, cond func(*dmv1.Resource) bool) *dmv1.Resource {
	e.t.Helper()
	var r *dmv1.Resource
	testutil.Eventually(e.t, name+": "+what, func() error {
		if r = e.resource(name); !cond(r) {
			return fmt.Errorf("last: %v", r)
		}
		return nil
	})
	return r
}

// waitCounts waits for allocatable/capacity of a resource.
func (e *env) waitCounts(name string, allocatable, capacity int64) *dmv1.Resource {
	e.t.Helper()
	return e.waitResource(name, fmt.Sprintf("%d/%d", allocatable, capacity), func(r *dmv1.Resource) bool {
		return r != nil && r.GetAllocatable() == allocatable && r.GetCapacity() == capacity
	})
}

// waitCalls waits until p saw n calls of method.
func waitCalls(t *testing.T, p *sampleplugin.Plugin, method string, n int) {
	t.Helper()
	testutil.WaitFor(t, fmt.Sprintf("%d %s calls", n, method), func() bool { return p.CallCount(method) >= n })
}

func contextWithCancel(t testing.TB) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*testutil.Deadline)
	t.Cleanup(cancel)
	return ctx, cancel
}
