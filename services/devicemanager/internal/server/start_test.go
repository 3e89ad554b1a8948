package server

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/cdispec"
)

func startReq(pod, container string) *dmv1.StartContainerRequest {
	return &dmv1.StartContainerRequest{PodUid: pod, ContainerName: container}
}

// resolves reads the spec directories as a runtime does and reports
// whether name is a device there, with its edits.
func resolves(t *testing.T, dirs []string, name string) (*cdi.Device, bool) {
	t.Helper()
	c, _ := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	d := c.GetDevice(name)
	return d, d != nil
}

// The kubelet calls PreStartContainer at every container start, with the
// container's devices of that resource; Allocate does not call it. The
// answer names the container's CDI device, whose spec holds the plugin's
// envs, mounts and device nodes, and carries the same edits merged.
func TestStartContainerPreStartsEveryStart(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/pre"
	p := e.plugin("pre", sampleplugin.Options{Resource: res, Devices: 4, PreStartRequired: true}, false)
	plain := e.plugin("plain", sampleplugin.Options{Resource: "example.com/plain", DeviceIDs: []string{"x-0", "x-1"}}, false)
	e.mustRegister(p)
	e.mustRegister(plain)
	e.waitCounts(res, 4, 4)
	e.waitCounts("example.com/plain", 2, 2)
	req := &dmv1.AllocateRequest{PodUid: "pod-1", ContainerName: "c", Resources: []*dmv1.ResourceRequest{
		{ResourceName: res, Count: 2}, {ResourceName: "example.com/plain", Count: 1},
	}}
	if _, err := e.client.Allocate(ctxT(t), req); err != nil {
		t.Fatal(err)
	}
	if n := p.CallCount(sampleplugin.MethodPreStartContainer); n != 0 {
		t.Fatalf("Allocate called PreStartContainer %d times", n)
	}
	for i := 1; i <= 2; i++ {
		resp, err := e.client.StartContainer(ctxT(t), startReq("pod-1", "c"))
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		if n := p.CallCount(sampleplugin.MethodPreStartContainer); n != i {
			t.Fatalf("after start %d PreStartContainer was called %d times", i, n)
		}
		if !slices.Equal(resp.GetPreStartedResources(), []string{res}) {
			t.Fatalf("pre-started %v, want only %s (the other plugin does not ask)", resp.GetPreStartedResources(), res)
		}
		want := "nodeplug.io/container=pod-1_c"
		if !slices.Equal(resp.GetCdiDevices(), []string{want}) {
			t.Fatalf("CDI devices %v, want [%s]", resp.GetCdiDevices(), want)
		}
		if !slices.Equal(resp.GetCdiSpecDirs(), []string{e.cdiExtraDir(), e.cdiDir()}) {
			t.Fatalf("spec dirs %v", resp.GetCdiSpecDirs())
		}
		ed := resp.GetEdits()
		if ed.GetEnvs()["NODEPLUG_DEVICES"] != "x-0" || len(ed.GetMounts()) != 3 || len(ed.GetDevices()) != 3 {
			t.Fatalf("edits %v: want the first resource's env (in name order, example.com/plain's) and the three devices' mounts and nodes", ed)
		}
	}
	calls := p.Calls()
	i := slices.IndexFunc(calls, func(c sampleplugin.Call) bool { return c.Method == sampleplugin.MethodPreStartContainer })
	if !slices.Equal(calls[i].DeviceIDs, []string{"dev-0", "dev-1"}) {
		t.Fatalf("PreStartContainer got %v, want the container's devices", calls[i].DeviceIDs)
	}
	if plain.CallCount(sampleplugin.MethodPreStartContainer) != 0 {
		t.Fatal("a plugin that does not ask was called")
	}
	d, ok := resolves(t, []string{e.cdiDir()}, "nodeplug.io/container=pod-1_c")
	if !ok {
		t.Fatal("the container's device does not resolve")
	}
	if !slices.Contains(d.ContainerEdits.Env, "NODEPLUG_DEVICES=x-0") || len(d.ContainerEdits.Mounts) != 3 || len(d.ContainerEdits.DeviceNodes) != 3 {
		t.Fatalf("spec edits %+v", d.ContainerEdits)
	}
}

// A PreStartContainer failure fails that start with the plugin's message
// and keeps the allocation; the next start, with the plugin well again,
// succeeds.
func TestStartContainerPreStartFailureKeepsAllocation(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/pre"
	p := e.plugin("pre", sampleplugin.Options{Resource: res, Devices: 2, PreStartRequired: true}, false)
	e.mustRegister(p)
	e.waitCounts(res, 2, 2)
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", res, 1)); err != nil {
		t.Fatal(err)
	}
	p.SetFailure(sampleplugin.MethodPreStartContainer, status.Error(codes.Unavailable, "device not ready"))
	_, err := e.client.StartContainer(ctxT(t), startReq("pod", "c"))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "PreStartContainer rpc failed with err: device not ready") {
		t.Fatalf("err = %v, want Unavailable with the plugin's message", err)
	}
	l, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{PodUid: "pod"})
	if err != nil || len(l.GetAllocations()) != 1 || e.resource(res).GetFree() != 1 {
		t.Fatalf("allocation after a failed start: %v, %v", l, err)
	}
	p.SetFailure(sampleplugin.MethodPreStartContainer, nil)
	if _, err := e.client.StartContainer(ctxT(t), startReq("pod", "c")); err != nil {
		t.Fatalf("start after the plugin recovered: %v", err)
	}
}

// Every CDI name a start returns must resolve: a plugin naming devices no
// spec defines fails the start before the plugin is told of it, naming the
// device and the directories. Once a spec defines them, the start gives
// nodeplug's device first, then the plugin's.
func TestStartContainerUnresolvedCDIName(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/cdi"
	p := e.plugin("cdi", sampleplugin.Options{Resource: res, Devices: 2, PreStartRequired: true, CDI: true}, false)
	e.mustRegister(p)
	e.waitCounts(res, 2, 2)
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", res, 1)); err != nil {
		t.Fatal(err)
	}
	_, err := e.client.StartContainer(ctxT(t), startReq("pod", "c"))
	want := `CDI device "example.com/cdi=dev-0" does not resolve in the CDI spec directories ` + e.cdiExtraDir() + ", " + e.cdiDir()
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), want) {
		t.Fatalf("err = %v, want FailedPrecondition with %q", err, want)
	}
	if n := p.CallCount(sampleplugin.MethodPreStartContainer); n != 0 {
		t.Fatalf("PreStartContainer called %d times for a start that cannot succeed", n)
	}
	writeVendorSpec(t, e.cdiExtraDir(), "example.com", "cdi", "dev-0", "dev-1")
	resp, err := e.client.StartContainer(ctxT(t), startReq("pod", "c"))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetCdiDevices(); !slices.Equal(got, []string{"nodeplug.io/container=pod_c", "example.com/cdi=dev-0"}) {
		t.Fatalf("CDI devices %v", got)
	}
}

// writeVendorSpec writes a vendor's spec defining devices of kind
// vendor/class, as a device plugin's installer would.
func writeVendorSpec(t *testing.T, dir, vendor, class string, devices ...string) {
	t.Helper()
	raw := &cdispecs.Spec{Version: cdispecs.CurrentVersion, Kind: vendor + "/" + class}
	for _, d := range devices {
		raw.Devices = append(raw.Devices, cdispecs.Device{Name: d, ContainerEdits: cdispecs.ContainerEdits{Env: []string{"VENDOR_DEVICE=" + d}}})
	}
	b, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, vendor+"-"+class+".json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestStartContainerNothingThere(t *testing.T) {
	e := newEnv(t, time.Minute)
	_, err := e.client.StartContainer(ctxT(t), startReq("pod", "c"))
	if status.Code(err) != codes.NotFound || !strings.Contains(err.Error(), "pod pod container c has no devices allocated and no DRA claims prepared") {
		t.Fatalf("err = %v, want NotFound", err)
	}
	for _, r := range []*dmv1.StartContainerRequest{startReq("", "c"), startReq("pod", "")} {
		if _, err := e.client.StartContainer(ctxT(t), r); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: err = %v, want InvalidArgument", r, err)
		}
	}
}

// The spec of a container is there from its Allocate (a runtime may be
// given the name without a start), gone at its Release; a restart writes
// a missing one again and removes one no allocation has.
func TestContainerSpecLifecycle(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/spec"
	p := e.plugin("spec", sampleplugin.Options{Resource: res, Devices: 4}, false)
	e.mustRegister(p)
	e.waitCounts(res, 4, 4)
	for _, c := range []string{"a", "b"} {
		if _, err := e.client.Allocate(ctxT(t), allocReq("pod", c, res, 1)); err != nil {
			t.Fatal(err)
		}
	}
	specFile := func(c string) string {
		return filepath.Join(e.cdiDir(), "nodeplug.io-container_"+cdispec.DeviceName("pod", c)+".json")
	}
	for _, c := range []string{"a", "b"} {
		if _, ok := resolves(t, []string{e.cdiDir()}, cdispec.QualifiedName("pod", c)); !ok {
			t.Fatalf("container %s has no CDI device after its Allocate", c)
		}
	}
	if _, err := e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod", ContainerName: "a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(specFile("a")); !os.IsNotExist(err) {
		t.Fatalf("spec of a released container: %v", err)
	}
	if _, err := os.Stat(specFile("b")); err != nil {
		t.Fatalf("spec of the container still allocated: %v", err)
	}

	e.shutdown()
	if err := os.Remove(specFile("b")); err != nil {
		t.Fatal(err)
	}
	stale := filepath.Join(e.cdiDir(), "nodeplug.io-container_gone_c.json")
	if err := os.WriteFile(stale, []byte(`{"cdiVersion":"0.3.0","kind":"nodeplug.io/container","devices":[{"name":"gone_c","containerEdits":{"env":["A=1"]}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(e.cdiDir(), "example.com-other.json")
	if err := os.WriteFile(other, []byte(`{}`), 0o644); err != nil {
		t.Fatal(err)
	}
	e.start()
	if _, err := os.Stat(specFile("b")); err != nil {
		t.Fatalf("missing spec not rewritten at start: %v", err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Fatalf("stale spec not removed at start: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("a spec file of another kind was touched: %v", err)
	}
	if _, err := e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(specFile("b")); !os.IsNotExist(err) {
		t.Fatalf("spec after the pod's release: %v", err)
	}
}
