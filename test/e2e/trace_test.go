package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

const (
	svcWatcher       = "nodeplug-watcher"
	svcReconciler    = "nodeplug-reconciler"
	svcDeviceManager = "nodeplug-devicemanager"
)

// TestRegistrationIsOneTrace: one socket created → one trace with spans from
// the watcher (the fsnotify event, the root), the reconciler (register
// operation, GetInfo, Validate, the handler call, Notify) and the
// devicemanager (RegisterPlugin, GetDevicePluginOptions, first ListAndWatch
// update), parented as DESIGN.md's contracts say. Then an Allocate is one
// trace too, with the plugin's Allocate call inside it.
func TestRegistrationIsOneTrace(t *testing.T) {
	sink := startSink(t)
	e := newEnv(t, sink.Env()...)
	p := e.plugin("traced", "example.com/traced", 2, false)
	e.waitAllocatable("example.com/traced", 2)

	var traceID string
	eventually(t, "the plugin's registration trace ID", func() error {
		pl := e.pluginBySocket(p.SocketPath())
		if pl == nil || pl.GetLastTraceId() == "" {
			return errors.New("no trace ID yet")
		}
		traceID = pl.GetLastTraceId()
		return nil
	})

	need := []struct{ service, name string }{
		{svcWatcher, "socket"},
		{svcReconciler, "register"},
		{svcReconciler, "GetInfo"},
		{svcReconciler, "Validate"},
		{svcReconciler, "NotifyRegistrationStatus"},
		{svcReconciler, "DeviceManagerService/RegisterPlugin"},
		{svcDeviceManager, "DeviceManagerService/RegisterPlugin"},
		{svcDeviceManager, "GetDevicePluginOptions"},
		{svcDeviceManager, "ListAndWatch"},
	}
	spans := sink.waitFor(t, traceID, func(spans []span) error {
		for _, n := range need {
			if _, ok := find(spans, n.service, n.name); !ok {
				return fmt.Errorf("no %s span named like %q", n.service, n.name)
			}
		}
		return nil
	})

	t.Logf("registration trace %s:\n%s", traceID, dump(spans))
	root, _ := find(spans, svcWatcher, "socket")
	if root.ParentID != "" {
		t.Fatalf("the watcher's event span must be the root, has parent %s\n%s", root.ParentID, dump(spans))
	}
	register, _ := find(spans, svcReconciler, "register")
	if register.ParentID != root.SpanID {
		t.Errorf("register operation is not a child of the watcher's event span\n%s", dump(spans))
	}
	for _, n := range need[2:] {
		sp, _ := find(spans, n.service, n.name)
		if !isDescendant(spans, sp, register) {
			t.Errorf("%s span %q does not descend from the register operation\n%s", n.service, sp.Name, dump(spans))
		}
	}
	dmServer, _ := find(spans, svcDeviceManager, "DeviceManagerService/RegisterPlugin")
	for _, name := range []string{"GetDevicePluginOptions", "ListAndWatch"} {
		sp, _ := find(spans, svcDeviceManager, name)
		if !isDescendant(spans, sp, dmServer) {
			t.Errorf("devicemanager span %q does not descend from its RegisterPlugin\n%s", sp.Name, dump(spans))
		}
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
	aspans := sink.waitFor(t, allocTrace, func(spans []span) error {
		if _, ok := find(spans, svcDeviceManager, "DeviceManagerService/Allocate"); !ok {
			return errors.New("no devicemanager Allocate server span")
		}
		if _, ok := find(spans, svcDeviceManager, "v1beta1.DevicePlugin/Allocate"); !ok {
			return errors.New("no plugin Allocate client span")
		}
		return nil
	})
	server, _ := find(aspans, svcDeviceManager, "DeviceManagerService/Allocate")
	client, _ := find(aspans, svcDeviceManager, "v1beta1.DevicePlugin/Allocate")
	if !isDescendant(aspans, client, server) {
		t.Errorf("the plugin's Allocate call is not inside the Allocate trace\n%s", dump(aspans))
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
