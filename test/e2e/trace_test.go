package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

const (
	svcWatcher       = "nodeplug-watcher"
	svcReconciler    = "nodeplug-reconciler"
	svcDeviceManager = "nodeplug-devicemanager"
)

// The spans of a registration and of an allocation, as DESIGN.md's
// contracts name them.
var (
	spanSocketCreated  = spanSpec{svcWatcher, kindProducer, "watcher.socket_created"}
	spanRegister       = spanSpec{svcReconciler, kindInternal, "reconciler.register"}
	spanGetInfo        = spanSpec{svcReconciler, kindInternal, "reconciler.GetInfo"}
	spanValidate       = spanSpec{svcReconciler, kindInternal, "reconciler.Validate"}
	spanNotify         = spanSpec{svcReconciler, kindInternal, "reconciler.NotifyRegistrationStatus"}
	spanRegisterCall   = spanSpec{svcReconciler, kindClient, "nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin"}
	spanRegisterPlugin = spanSpec{svcDeviceManager, kindServer, "nodeplug.devicemanager.v1.DeviceManagerService/RegisterPlugin"}
	spanOptions        = spanSpec{svcDeviceManager, kindInternal, "GetDevicePluginOptions"}
	// Not the client span of the ListAndWatch stream (kind client, named
	// v1beta1.DevicePlugin/ListAndWatch), which exists as soon as the
	// stream opens, whether or not an update arrives.
	spanFirstUpdate   = spanSpec{svcDeviceManager, kindInternal, "first ListAndWatch update"}
	spanAllocate      = spanSpec{svcDeviceManager, kindServer, "nodeplug.devicemanager.v1.DeviceManagerService/Allocate"}
	spanAllocateCall  = spanSpec{svcDeviceManager, kindClient, "v1beta1.DevicePlugin/Allocate"}
	registrationSpans = []spanSpec{spanRegister, spanGetInfo, spanValidate, spanNotify, spanRegisterCall, spanRegisterPlugin, spanOptions, spanFirstUpdate}
)

// TestRegistrationIsOneTrace: one socket created → one trace with spans from
// the watcher (the fsnotify event, the root), the reconciler (register
// operation, GetInfo, Validate, the handler call, Notify) and the
// devicemanager (RegisterPlugin, GetDevicePluginOptions, first ListAndWatch
// update), parented as DESIGN.md's contracts say. When the first attempt
// fails (GetInfo has a 1 s budget, which a busy machine can miss), the
// attempt that succeeds is a new trace whose register span links to the
// first attempt's, and the watcher's event is the root of the linked trace:
// the second case makes the first GetInfo miss its budget. Then an Allocate
// is one trace too, with the plugin's Allocate call inside it.
func TestRegistrationIsOneTrace(t *testing.T) {
	sink := startSink(t)
	e := newEnv(t, sink.Env()...)
	// Both cases in one stack, in sequence.
	for _, tc := range []struct {
		resource string
		retried  bool // the first GetInfo misses its budget
	}{
		{"example.com/traced", false},
		{"example.com/retried", true},
	} {
		p, err := sampleplugin.New(sampleplugin.Options{Resource: tc.resource, Devices: 2,
			SocketPath: filepath.Join(layout.PluginsRegistryDir(e.root), strings.ReplaceAll(tc.resource, "/", "_")+".sock")})
		if err != nil {
			t.Fatal(err)
		}
		if tc.retried {
			p.SetGetInfoDelay(time.Hour)
		}
		if err := p.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(p.Stop)
		if tc.retried {
			testutil.WaitFor(t, "the first GetInfo", func() bool { return p.GetInfoCalls() > 0 })
			p.SetGetInfoDelay(0)
		}
		e.waitAllocatable(tc.resource, 2)
		checkRegistrationTrace(t, e, sink, p.SocketPath(), tc.retried)
	}

	// Allocate: traced, with the trace ID kept on the allocation.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := e.dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: "pod-trace", ContainerName: "main",
		Resources: []*dmv1.ResourceRequest{{ResourceName: "example.com/traced", Count: 1}}}); err != nil {
		t.Fatal(err)
	}
	allocs, err := e.dm.ListAllocations(ctx, &dmv1.ListAllocationsRequest{PodUid: "pod-trace"})
	if err != nil || len(allocs.GetAllocations()) != 1 || allocs.GetAllocations()[0].GetTraceId() == "" {
		t.Fatalf("ListAllocations = %v, %v; want one allocation with a trace ID", allocs, err)
	}
	allocTrace := allocs.GetAllocations()[0].GetTraceId()
	aspans := sink.waitFor(t, allocTrace, func(spans []span) error { return findAll(spans, spanAllocate, spanAllocateCall) })
	server, _ := find(aspans, spanAllocate)
	client, _ := find(aspans, spanAllocateCall)
	if !isDescendant(aspans, client, server) {
		t.Errorf("the plugin's Allocate call is not inside the Allocate trace\n%s", dump(aspans))
	}
}

// checkRegistrationTrace checks the trace of the registration of the plugin
// at socket, following the link of a retry back to the first attempt;
// retried says a retry must have happened.
func checkRegistrationTrace(t *testing.T, e *env, sink *otlpSink, socket string, retried bool) {
	t.Helper()
	// The trace of the attempt that succeeded: the last one, once the
	// plugin is registered.
	var traceID string
	testutil.Eventually(t, "the plugin registered, with its trace ID", func() error {
		pl := e.pluginBySocket(socket)
		if pl.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED || pl.GetLastTraceId() == "" {
			return fmt.Errorf("plugin %v", pl)
		}
		traceID = pl.GetLastTraceId()
		return nil
	})
	spans := sink.waitFor(t, traceID, func(spans []span) error {
		if err := findAll(spans, registrationSpans...); err != nil {
			return err
		}
		// A first attempt's trace also holds the watcher's event span, which
		// the watcher exports on its own schedule, apart from the others:
		// wait for it too.
		if r, _ := find(spans, spanRegister); len(r.Links) == 0 {
			return findAll(spans, spanSocketCreated)
		}
		return nil
	})
	t.Logf("registration trace %s:\n%s", traceID, dump(spans))

	register, _ := find(spans, spanRegister)
	first, firstSpans := register, spans
	switch {
	case len(register.Links) > 0:
		if register.ParentID != "" {
			t.Fatalf("a retried register operation must start a new trace, has parent %s\n%s", register.ParentID, dump(spans))
		}
		link := register.Links[0]
		firstSpans = sink.waitFor(t, link.TraceID, func(spans []span) error {
			if err := findAll(spans, spanSocketCreated); err != nil {
				return err
			}
			for _, sp := range spans {
				if sp.SpanID == link.SpanID {
					first = sp
					return nil
				}
			}
			return fmt.Errorf("no span %s, the link's target", link.SpanID)
		})
		t.Logf("retried; the first attempt, trace %s:\n%s", link.TraceID, dump(firstSpans))
		if first.Service != spanRegister.service || first.Kind != spanRegister.kind || first.Name != spanRegister.name {
			t.Fatalf("the retry links to the %s %s span %q, not to the first register operation", first.Service, first.Kind, first.Name)
		}
	case retried:
		t.Fatalf("the registration was retried, but its register span links to nothing\n%s", dump(spans))
	}
	root, _ := find(firstSpans, spanSocketCreated)
	if root.ParentID != "" {
		t.Fatalf("the watcher's event span must be the root, has parent %s\n%s", root.ParentID, dump(firstSpans))
	}
	if first.ParentID != root.SpanID {
		t.Errorf("the (first) register operation is not a child of the watcher's event span\n%s", dump(firstSpans))
	}
	for _, spec := range registrationSpans[1:] {
		sp, _ := find(spans, spec)
		if !isDescendant(spans, sp, register) {
			t.Errorf("%s does not descend from the register operation\n%s", spec, dump(spans))
		}
	}
	dmServer, _ := find(spans, spanRegisterPlugin)
	for _, spec := range []spanSpec{spanOptions, spanFirstUpdate} {
		sp, _ := find(spans, spec)
		if !isDescendant(spans, sp, dmServer) {
			t.Errorf("%s does not descend from the devicemanager's RegisterPlugin\n%s", spec, dump(spans))
		}
	}

	// Logs carry trace and span IDs.
	found := false
	for _, rec := range e.st.Process("reconciler").LogLines("") {
		if rec["trace_id"] == traceID && rec["span_id"] != nil {
			found = true
			break
		}
	}
	if !found {
		t.Errorf("no reconciler log line carries trace_id %s and a span_id", traceID)
	}
}
