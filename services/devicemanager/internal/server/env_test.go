package server

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/deviceplugin"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
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

const waitFor = 30 * time.Second

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("NODEPLUG_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// env is a devicemanager driven in-process through its gRPC API over a real
// Unix socket.
type env struct {
	t       testing.TB
	root    string
	dpDir   string
	regDir  string
	grace   time.Duration
	d       *Daemon
	metrics *prometheus.Registry
	client  dmv1.DeviceManagerServiceClient
	stop    func()
	stopped bool
}

func newEnv(t testing.TB, grace time.Duration) *env {
	t.Helper()
	root, err := os.MkdirTemp("", "np")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	e := &env{t: t, root: root, dpDir: filepath.Join(root, "device-plugins"), regDir: filepath.Join(root, "plugins_registry"), grace: grace}
	if err := os.MkdirAll(e.regDir, 0o750); err != nil {
		t.Fatal(err)
	}
	e.start()
	t.Cleanup(e.shutdown)
	return e
}

func (e *env) start() {
	e.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	e.metrics = prometheus.NewRegistry()
	d, err := Start(ctx, Options{DevicePluginsDir: e.dpDir, AllowedDirs: []string{e.root}, GracePeriod: e.grace, Log: testLogger(e.t), Registerer: e.metrics})
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	srv, _ := rpcutil.NewServer(testLogger(e.t))
	dmv1.RegisterDeviceManagerServiceServer(srv, d.Service)
	lis, err := unixsock.Listen(filepath.Join(e.root, "dm.sock"))
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	served, ran := make(chan struct{}), make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	go func() {
		defer close(ran)
		if err := d.Run(ctx); err != nil {
			e.t.Errorf("daemon run: %v", err)
		}
	}()
	conn, err := rpcutil.DialPeer(filepath.Join(e.root, "dm.sock"))
	if err != nil {
		e.t.Fatal(err)
	}
	e.d, e.client, e.stopped = d, dmv1.NewDeviceManagerServiceClient(conn), false
	e.stop = func() {
		_ = conn.Close()
		srv.Stop()
		<-served
		cancel()
		<-ran
	}
}

func (e *env) shutdown() {
	if !e.stopped {
		e.stopped = true
		e.stop()
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

// plugin starts a device plugin with its socket in plugins_registry, or in
// device-plugins when legacy is set.
func (e *env) plugin(name string, opts deviceplugin.Options, legacy bool) *deviceplugin.Plugin {
	e.t.Helper()
	dir := e.regDir
	if legacy {
		dir = e.dpDir
	}
	opts.SocketPath = filepath.Join(dir, name+".sock")
	if opts.Log == nil {
		opts.Log = testLogger(e.t)
	}
	p, err := deviceplugin.New(opts)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(p.Stop)
	return p
}

// generation is the watcher's generation of a socket.
func generation(t testing.TB, path string) string {
	t.Helper()
	id, _, err := unixsock.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return id.Generation()
}

// register registers p through RegisterPlugin, as the reconciler does.
func (e *env) register(p *deviceplugin.Plugin) (*dmv1.RegisterPluginResponse, error) {
	return e.client.RegisterPlugin(ctxT(e.t), &dmv1.RegisterPluginRequest{
		ResourceName: p.Resource(), Endpoint: p.SocketPath(), Versions: []string{pluginapi.Version},
		SocketPath: p.SocketPath(), Generation: generation(e.t, p.SocketPath()),
	})
}

func (e *env) mustRegister(p *deviceplugin.Plugin) {
	e.t.Helper()
	if _, err := e.register(p); err != nil {
		e.t.Fatalf("RegisterPlugin %s: %v", p.SocketPath(), err)
	}
}

func (e *env) kubeletSock() string { return filepath.Join(e.dpDir, KubeletSocketName) }

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

// waitResource polls until cond holds for the named resource (nil when
// absent).
func (e *env) waitResource(name, what string, cond func(*dmv1.Resource) bool) *dmv1.Resource {
	e.t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		r := e.resource(name)
		if cond(r) {
			return r
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("%s: waited %v for %s; last: %v", name, waitFor, what, r)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitCounts waits for allocatable/capacity of a resource.
func (e *env) waitCounts(name string, allocatable, capacity int64) *dmv1.Resource {
	e.t.Helper()
	return e.waitResource(name, fmt.Sprintf("%d/%d", allocatable, capacity), func(r *dmv1.Resource) bool {
		return r != nil && r.GetAllocatable() == allocatable && r.GetCapacity() == capacity
	})
}

// waitCalls polls until p saw n calls of method.
func waitCalls(t *testing.T, p *deviceplugin.Plugin, method string, n int) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for p.CallCount(method) < n {
		if time.Now().After(deadline) {
			t.Fatalf("waited for %d %s calls, have %d", n, method, p.CallCount(method))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func contextWithCancel(t testing.TB) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitFor)
	t.Cleanup(cancel)
	return ctx, cancel
}
