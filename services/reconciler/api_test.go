package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
)

// findSpan waits for an ended span named name in trace traceID.
func findSpan(t *testing.T, name, traceID string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	testutil.WaitFor(t, "span "+name+" in trace "+traceID, func() bool {
		for _, s := range spans.Ended() {
			if s.Name() == name && s.SpanContext().TraceID().String() == traceID {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

func childNames(parent sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans.Ended() {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() && s.Parent().TraceID() == parent.SpanContext().TraceID() {
			out[s.Name()] = s
		}
	}
	return out
}

// Tracing as DESIGN.md's contracts say: a live event's trace is continued
// (GetInfo, Validate, handler, Notify as children, the plugin RPCs beneath
// them); a snapshot item starts a root; a retry is a new trace linked to
// the first attempt.
func TestTracing(t *testing.T) {
	e := newEnv(t)

	t.Run("live event", func(t *testing.T) {
		p := e.plugin("live", devicePlugin("example.com/live"))
		traceID := e.w.Created(t, p.Path())
		if st := e.waitRegistered(p.Path()); st.LastTraceID != traceID {
			t.Fatalf("last trace ID %s, want the event's %s", st.LastTraceID, traceID)
		}
		reg := findSpan(t, "reconciler.register", traceID)
		if !reg.Parent().IsValid() || reg.Parent().TraceID().String() != traceID {
			t.Fatalf("register span's parent = %v, want the watcher event's span", reg.Parent())
		}
		testutil.WaitFor(t, "register span's children", func() bool { return len(childNames(reg)) >= 4 })
		children := childNames(reg)
		for _, name := range []string{"reconciler.GetInfo", "reconciler.Validate", "reconciler.handler.Register", "reconciler.NotifyRegistrationStatus"} {
			if _, ok := children[name]; !ok {
				t.Fatalf("register span lacks child %s; has %v", name, children)
			}
		}
		if rpcs := childNames(children["reconciler.GetInfo"]); rpcs["pluginregistration.Registration/GetInfo"] == nil {
			t.Fatalf("GetInfo span lacks the RPC client span; has %v", rpcs)
		}
		if rpcs := childNames(children["reconciler.handler.Register"]); rpcs["nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin"] == nil {
			t.Fatalf("handler span lacks the devicemanager RPC span; has %v", rpcs)
		}
	})

	t.Run("unregister continues the delete event", func(t *testing.T) {
		p := e.plugin("gone", devicePlugin("example.com/gone"))
		e.w.Created(t, p.Path())
		e.waitRegistered(p.Path())
		p.Stop()
		traceID := e.w.Deleted(p.Path())
		e.waitGone(p.Path())
		un := findSpan(t, "reconciler.unregister", traceID)
		testutil.WaitFor(t, "deregister span", func() bool { return childNames(un)["reconciler.handler.Deregister"] != nil })
		if rpcs := childNames(childNames(un)["reconciler.handler.Deregister"]); rpcs["nodeplug.devicemanager.v1.DeviceManagerService/DeregisterPlugin"] == nil {
			t.Fatalf("deregister span lacks the devicemanager RPC span; has %v", rpcs)
		}
	})

	t.Run("retry links to first attempt", func(t *testing.T) {
		p := e.plugin("retry", draPlugin("dra.example.com"))
		p.SetNotifyError(errors.New("not yet"))
		first := e.w.Created(t, p.Path())
		e.waitFailed(p.Path(), 1)
		firstSpan := findSpan(t, "reconciler.register", first)
		p.SetNotifyError(nil)
		e.advanceBackoff()
		st := e.waitRegistered(p.Path())
		if st.LastTraceID == first {
			t.Fatal("retry continued the first attempt's trace")
		}
		retry := findSpan(t, "reconciler.register", st.LastTraceID)
		if retry.Parent().IsValid() {
			t.Fatalf("retry span has a parent %v, want a root", retry.Parent())
		}
		links := retry.Links()
		if len(links) != 1 || links[0].SpanContext.SpanID() != firstSpan.SpanContext().SpanID() {
			t.Fatalf("retry links = %+v, want the first attempt's span", links)
		}
	})

	t.Run("snapshot item starts a root", func(t *testing.T) {
		p := e.plugin("snap", draPlugin("dra-snap.example.com"))
		streams := e.w.Streams()
		e.w.Restart(func(m map[string]string) { m[p.Path()] = testutil.Generation(t, p.Path()) })
		testutil.WaitFor(t, "new stream", func() bool { return e.w.Streams() > streams })
		st := e.waitRegistered(p.Path())
		if reg := findSpan(t, "reconciler.register", st.LastTraceID); reg.Parent().IsValid() {
			t.Fatalf("snapshot registration has parent %v", reg.Parent())
		}
	})
}

func serviceClient(t *testing.T, e *env) reconcilerv1.ReconcilerServiceClient {
	path := filepath.Join(e.root, "reconciler.sock")
	serve(t, path, func(s *grpc.Server) { e.s.api.Register(s) })
	conn, err := rpcutil.DialPeer(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return reconcilerv1.NewReconcilerServiceClient(conn)
}

// The ReconcilerService API over gRPC: ListPlugins, WatchPlugins
// (snapshot → synced → live) and ListDrivers.
func TestServiceAPI(t *testing.T) {
	e := newEnv(t)
	c := serviceClient(t, e)
	ctx := waitCtx(t)

	a := e.plugin("a", draPlugin("dra.example.com"))
	e.w.Created(t, a.Path())
	e.waitRegistered(a.Path())
	bad := e.plugin("bad", testplugin.Info{Type: "FooPlugin", Name: "foo"})
	e.w.Created(t, bad.Path())
	e.waitFailed(bad.Path(), 1)

	list, err := c.ListPlugins(ctx, &reconcilerv1.ListPluginsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if list.GetInstanceId() == "" || len(list.GetPlugins()) != 2 {
		t.Fatalf("ListPlugins = %v", list)
	}
	pa, pb := list.GetPlugins()[0], list.GetPlugins()[1]
	if pa.GetSocketPath() != a.Path() || pa.GetState() != reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED || pa.GetName() != "dra.example.com" ||
		pa.GetType() != "DRAPlugin" || pa.GetEndpoint() != a.Path() || pa.GetGeneration() == "" || pa.GetLastTraceId() == "" || pa.GetNextRetryTime() != nil {
		t.Fatalf("registered plugin = %v", pa)
	}
	if pb.GetState() != reconcilerv1.PluginState_PLUGIN_STATE_FAILED || pb.GetFailures() != 1 || pb.GetLastError() == "" ||
		!pb.GetNextRetryTime().AsTime().Equal(e.clk.Now().Add(executor.InitialBackoff)) {
		t.Fatalf("failed plugin = %v", pb)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := c.WatchPlugins(wctx, &reconcilerv1.WatchPluginsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var snapshot []*reconcilerv1.Plugin
	for {
		m, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetSynced() != nil {
			break
		}
		snapshot = append(snapshot, m.GetChange().GetPlugin())
	}
	if len(snapshot) != 2 {
		t.Fatalf("snapshot = %v", snapshot)
	}
	d := e.plugin("d", draPlugin("dra2.example.com"))
	e.w.Created(t, d.Path())
	recvUntil := func(what string, match func(*reconcilerv1.PluginChange) bool) {
		t.Helper()
		for {
			m, err := w.Recv()
			if err != nil {
				t.Fatalf("waiting for %s: %v", what, err)
			}
			if ch := m.GetChange(); ch != nil && match(ch) {
				return
			}
		}
	}
	recvUntil("d registered", func(ch *reconcilerv1.PluginChange) bool {
		return ch.GetPlugin().GetSocketPath() == d.Path() && ch.GetPlugin().GetState() == reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED
	})
	d.Stop()
	e.w.Deleted(d.Path())
	recvUntil("d removed", func(ch *reconcilerv1.PluginChange) bool {
		return ch.GetPlugin().GetSocketPath() == d.Path() && ch.GetType() == reconcilerv1.PluginChangeType_PLUGIN_CHANGE_TYPE_REMOVED
	})

	csiPlugin := e.plugin("csi", testplugin.Info{Type: "CSIPlugin", Name: "csi.example.com", Versions: []string{"1.0.0"}}, csiOptions("csi.example.com"))
	e.w.Created(t, csiPlugin.Path())
	e.waitRegistered(csiPlugin.Path())
	drivers, err := c.ListDrivers(ctx, &reconcilerv1.ListDriversRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(drivers.GetDraDrivers()) != 1 || drivers.GetDraDrivers()[0].GetName() != "dra.example.com" ||
		len(drivers.GetCsiDrivers()) != 1 || drivers.GetCsiDrivers()[0].GetNodeId() != "node-1" ||
		drivers.GetCsiDrivers()[0].GetAccessibleTopology()["topology.example.com/zone"] != "a" || drivers.GetCsiDrivers()[0].GetMaxVolumesPerNode() != 16 {
		t.Fatalf("ListDrivers = %v", drivers)
	}
}

// WatchPlugins is bounded in streams: past the limit a stream gets
// RESOURCE_EXHAUSTED over gRPC, an ended stream makes room for the next,
// and the streams give back what they held when they end. (The bytes
// bound is tested over gRPC in pkg/stream and the watcher.)
func TestWatchPluginsBounds(t *testing.T) {
	const max = 2
	e := newEnvWith(t, func(c *config) { c.WatchLimits = stream.Limits{Subscribers: max} })
	reg := prometheus.NewRegistry()
	if err := e.s.status.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	c := serviceClient(t, e)
	a := e.plugin("a", draPlugin("dra.example.com"))
	e.w.Created(t, a.Path())
	e.waitRegistered(a.Path())

	watch := func(ctx context.Context) error {
		w, err := c.WatchPlugins(ctx, &reconcilerv1.WatchPluginsRequest{})
		if err != nil {
			return err
		}
		for {
			m, err := w.Recv()
			if err != nil {
				return err
			}
			if m.GetSynced() != nil {
				return nil
			}
		}
	}
	ctx, cancel := context.WithCancel(waitCtx(t))
	defer cancel()
	for i := range max {
		if err := watch(ctx); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	if err := watch(ctx); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("stream %d: %v, want RESOURCE_EXHAUSTED", max+1, err)
	}
	cancel()
	testutil.WaitFor(t, "the streams gone and their bytes given back", func() bool {
		families, _ := reg.Gather()
		n, _ := gauge(families, "nodeplug_reconciler_watchers", nil)
		held, _ := gauge(families, "nodeplug_reconciler_watcher_bytes", nil)
		return n == 0 && held == 0
	})
	if err := watch(waitCtx(t)); err != nil {
		t.Fatalf("a stream after the others ended: %v", err)
	}
}

func gauge(families []*dto.MetricFamily, name string, labels map[string]string) (float64, bool) {
	return testutil.MetricValue(testutil.FindMetric(families, name, labels))
}

// Metrics: the kubelet's plugin_manager_total_plugins over the DSW and ASW,
// nodeplug_plugins by state, registration counts and latency.
func TestMetrics(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	if err := e.s.loop.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	a := e.plugin("a", draPlugin("dra.example.com"))
	e.w.Created(t, a.Path())
	e.waitRegistered(a.Path())
	bad := e.plugin("bad", testplugin.Info{Type: "FooPlugin", Name: "foo"})
	e.w.Created(t, bad.Path())
	e.waitFailed(bad.Path(), 1)

	// An attempt is counted once it has ended, just after the plugin's
	// state says so: the table is waited for, then checked.
	var families []*dto.MetricFamily
	testutil.Eventually(t, "both attempts counted", func() error {
		var err error
		if families, err = reg.Gather(); err != nil {
			return err
		}
		for _, l := range []map[string]string{{"type": "DRAPlugin", "result": "success"}, {"type": "other", "result": "failure"}} {
			if got, _ := gauge(families, "nodeplug_plugin_registrations_total", l); got < 1 {
				return fmt.Errorf("nodeplug_plugin_registrations_total%v = %v", l, got)
			}
		}
		return nil
	})
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"plugin_manager_total_plugins", map[string]string{"socket_path": a.Path(), "state": "desired_state_of_world"}, 1},
		{"plugin_manager_total_plugins", map[string]string{"socket_path": a.Path(), "state": "actual_state_of_world"}, 1},
		{"plugin_manager_total_plugins", map[string]string{"socket_path": bad.Path(), "state": "desired_state_of_world"}, 1},
		{"nodeplug_plugins", map[string]string{"state": "registered"}, 1},
		{"nodeplug_plugins", map[string]string{"state": "failed"}, 1},
		{"nodeplug_plugins", map[string]string{"state": "pending"}, 0},
		{"nodeplug_plugin_registrations_total", map[string]string{"type": "DRAPlugin", "result": "success"}, 1},
		{"nodeplug_plugin_registrations_total", map[string]string{"type": "other", "result": "failure"}, 1},
		{"nodeplug_plugin_registration_duration_seconds", map[string]string{"type": "DRAPlugin"}, 1},
	} {
		if got, ok := gauge(families, tc.name, tc.labels); !ok || got != tc.want {
			t.Errorf("%s%v = %v (present %v), want %v", tc.name, tc.labels, got, ok, tc.want)
		}
	}
	if _, ok := gauge(families, "plugin_manager_total_plugins", map[string]string{"socket_path": bad.Path(), "state": "actual_state_of_world"}); ok {
		t.Error("a failed plugin is counted in the actual state of world")
	}
}
