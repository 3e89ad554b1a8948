package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// spansOf returns the ended spans of trace id.
func spansOf(id string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.SpanContext().TraceID().String() == id {
			out = append(out, s)
		}
	}
	return out
}

func findSpan(ss []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	for _, s := range ss {
		if strings.Contains(s.Name(), name) {
			return s
		}
	}
	return nil
}

// waitSpans waits until trace id has an ended span named like each of
// names, and returns the trace's ended spans.
func waitSpans(t *testing.T, id string, names ...string) []sdktrace.ReadOnlySpan {
	t.Helper()
	var ss []sdktrace.ReadOnlySpan
	testutil.Eventually(t, "spans "+strings.Join(names, ", ")+" in trace "+id, func() error {
		ss = spansOf(id)
		for _, n := range names {
			if findSpan(ss, n) == nil {
				var have []string
				for _, s := range ss {
					have = append(have, s.Name())
				}
				return fmt.Errorf("no span %q; has %v", n, have)
			}
		}
		return nil
	})
	return ss
}

// waitSpan waits until an ended span matches and returns it.
func waitSpan(t *testing.T, what string, match func(sdktrace.ReadOnlySpan) bool) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	testutil.WaitFor(t, what, func() bool {
		for _, s := range spans.Ended() {
			if match(s) {
				found = s
				return true
			}
		}
		return false
	})
	return found
}

func TestTracing(t *testing.T) {
	e := newEnv(t, time.Minute)
	tracer := otel.Tracer("test")

	// RegisterPlugin continues the caller's trace.
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/traced", Devices: 2}, false)
	ctx, root := tracer.Start(ctxT(t), "reconciler register")
	id := root.SpanContext().TraceID().String()
	if _, err := e.client.RegisterPlugin(ctx, &dmv1.RegisterPluginRequest{
		ResourceName: p.Resource(), Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, SocketPath: p.SocketPath(), Generation: "g",
	}); err != nil {
		t.Fatal(err)
	}
	root.End()
	ss := waitSpans(t, id, "connect example.com/traced", "GetDevicePluginOptions",
		"v1beta1.DevicePlugin/GetDevicePluginOptions", "first ListAndWatch update")
	// The server span ends after the reply has been sent, so it may end
	// after the client has the reply: wait for it. The test's client span
	// has the same name; the parent is the server's.
	server := waitSpan(t, "the RegisterPlugin server span", func(s sdktrace.ReadOnlySpan) bool {
		return s.SpanContext().TraceID() == root.SpanContext().TraceID() && s.SpanKind() == trace.SpanKindServer &&
			strings.Contains(s.Name(), "DeviceManagerService/RegisterPlugin")
	})
	for _, n := range []string{"connect example.com/traced", "first ListAndWatch update"} {
		if s := findSpan(ss, n); s.Parent().SpanID() != server.SpanContext().SpanID() {
			t.Errorf("span %q is not a child of the RegisterPlugin server span", n)
		}
	}

	// A legacy Register starts its own trace.
	legacy := e.plugin("legacy", sampleplugin.Options{Resource: "example.com/traced-legacy", Devices: 1}, true)
	lctx, lroot := tracer.Start(ctxT(t), "plugin")
	if err := legacy.Register(lctx, e.kubeletSock()); err != nil {
		t.Fatal(err)
	}
	lroot.End()
	e.waitCounts("example.com/traced-legacy", 1, 1)
	reg := waitSpan(t, "the legacy Register span", func(s sdktrace.ReadOnlySpan) bool {
		return s.Name() == "legacy Register example.com/traced-legacy"
	})
	if reg.Parent().IsValid() || reg.SpanContext().TraceID() == lroot.SpanContext().TraceID() {
		t.Fatal("the legacy Register span is not a new root")
	}
	waitSpans(t, reg.SpanContext().TraceID().String(), "GetDevicePluginOptions", "first ListAndWatch update")

	// Allocate is traced with its plugin call, and the trace ID is saved.
	e.waitCounts("example.com/traced", 2, 2)
	actx, aroot := tracer.Start(ctxT(t), "scheduler")
	if _, err := e.client.Allocate(actx, allocReq("pod", "c", "example.com/traced", 1)); err != nil {
		t.Fatal(err)
	}
	aroot.End()
	aid := aroot.SpanContext().TraceID().String()
	waitSpans(t, aid, "DeviceManagerService/Allocate", "v1beta1.DevicePlugin/Allocate")
	l, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{PodUid: "pod"})
	if err != nil || l.GetAllocations()[0].GetTraceId() != aid {
		t.Fatalf("allocation trace ID: %v, %v; want %s", l, err, aid)
	}
}

func metricValue(t *testing.T, e *env, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := e.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := testutil.MetricValue(testutil.FindMetric(mfs, name, labels))
	if !ok {
		return -1
	}
	return v
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/metered"
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: 3}, true)
	if err := p.Register(ctxT(t), e.kubeletSock()); err != nil {
		t.Fatal(err)
	}
	p2 := e.plugin("p2", sampleplugin.Options{Resource: res, Devices: 3}, false)
	e.mustRegister(p2)
	e.waitCounts(res, 3, 3)
	if err := p2.SetHealth("dev-0", false); err != nil {
		t.Fatal(err)
	}
	e.waitCounts(res, 2, 3)
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", res, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", res, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod"}); err != nil {
		t.Fatal(err)
	}
	rl := map[string]string{"resource_name": res}
	checks := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"kubelet_device_plugin_registration_total", rl, 2},
		{"kubelet_device_plugin_alloc_duration_seconds", rl, 1},
		{"kubelet_device_plugin_devices", map[string]string{"resource_name": res, "health_state": "healthy"}, 2},
		{"kubelet_device_plugin_devices", map[string]string{"resource_name": res, "health_state": "unhealthy"}, 1},
		{"nodeplug_devicemanager_allocations_total", map[string]string{"resource_name": res, "result": "allocated"}, 1},
		{"nodeplug_devicemanager_allocations_total", map[string]string{"resource_name": res, "result": "reused"}, 1},
		{"nodeplug_devicemanager_released_devices_total", rl, 1},
	}
	for _, c := range checks {
		if got := metricValue(t, e, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
