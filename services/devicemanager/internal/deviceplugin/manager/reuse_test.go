package manager

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// The kubelet's device manager reuses the devices of a pod's init
// containers (Allocate, devicesToReuse; its tests
// TestInitContainerDeviceAllocation and
// TestRestartableInitContainerDeviceAllocation): init containers run one
// at a time before the app containers, so the containers allocated after
// one take its devices first; a sidecar or an app container keeps its own.

// allocKind allocates count devices of res to the container of pod, of
// kind, and returns them.
func allocKind(t *testing.T, m *Manager, pod, ctr string, kind allocator.ContainerKind, res string, count int64) []string {
	t.Helper()
	out, err := m.Allocate(ctxT(t), &allocator.Request{PodUID: pod, Container: ctr, Kind: kind,
		Resources: []allocator.ResourceRequest{{Name: res, Count: count}}})
	if err != nil {
		t.Fatalf("Allocate %s/%s (%q): %v", pod, ctr, kind, err)
	}
	if len(out) != 1 || len(out[0].DeviceIDs) != int(count) || out[0].Kind != kind {
		t.Fatalf("Allocate %s/%s (%q) = %+v", pod, ctr, kind, out)
	}
	return out[0].DeviceIDs
}

// free returns the free count and the allocated devices of the one
// resource m has.
func free(t *testing.T, m *Manager) (int64, []string) {
	t.Helper()
	rs := m.ListResources()
	if len(rs) != 1 {
		t.Fatalf("resources %+v", rs)
	}
	return rs[0].Free, rs[0].Allocated
}

// TestInitDevicesReused: a node with just enough devices for the app
// containers takes a pod whose init containers ask for devices too: a
// later init container and the first app container take the init
// container's devices (the plugin is asked to allocate them for each), a
// second app container gets devices of its own, disjoint from the first
// one's; every device is counted allocated once. Another pod gets none of
// the shared devices.
func TestInitDevicesReused(t *testing.T) {
	const res = "example.com/reuse"
	m, p, _ := registered(t, res, 4)
	init1 := allocKind(t, m, "pod", "init-1", allocator.KindInit, res, 2)
	init2 := allocKind(t, m, "pod", "init-2", allocator.KindInit, res, 1)
	if !slices.Contains(init1, init2[0]) {
		t.Fatalf("init-2 got %v, not one of init-1's %v", init2, init1)
	}
	app1 := allocKind(t, m, "pod", "app-1", allocator.KindApp, res, 2)
	if !slices.Equal(app1, init1) {
		t.Fatalf("app-1 got %v, want init-1's %v", app1, init1)
	}
	app2 := allocKind(t, m, "pod", "app-2", allocator.KindApp, res, 2)
	if slices.ContainsFunc(app2, func(id string) bool { return slices.Contains(app1, id) }) {
		t.Fatalf("app-2 got %v, shared with app-1's %v", app2, app1)
	}
	if n, allocated := free(t, m); n != 0 || len(allocated) != 4 {
		t.Fatalf("free %d, allocated %v; want 0 and the 4 devices once each", n, allocated)
	}
	var asked [][]string
	for _, c := range p.Calls() {
		if c.Method == sampleplugin.MethodAllocate {
			asked = append(asked, c.DeviceIDs)
		}
	}
	if len(asked) != 4 || !slices.Equal(asked[2], init1) {
		t.Fatalf("the plugin's Allocate calls %v; want one per container, app-1's with %v", asked, init1)
	}
	// All four are held: nothing for another pod, nor a third app container.
	for _, r := range []*allocator.Request{
		{PodUID: "other", Container: "app", Resources: []allocator.ResourceRequest{{Name: res, Count: 1}}},
		{PodUID: "pod", Container: "app-3", Resources: []allocator.ResourceRequest{{Name: res, Count: 1}}},
	} {
		if _, err := m.Allocate(ctxT(t), r); !errors.Is(err, errdefs.ErrFailedPrecondition) ||
			!strings.Contains(err.Error(), "Requested: 1, Available: 0") {
			t.Fatalf("Allocate %s/%s with every device held: %v", r.PodUID, r.Container, err)
		}
	}
	got := m.ListAllocations("pod")
	kinds := map[string]allocator.ContainerKind{}
	for _, a := range got {
		kinds[a.Container] = a.Kind
	}
	want := map[string]allocator.ContainerKind{"init-1": allocator.KindInit, "init-2": allocator.KindInit, "app-1": allocator.KindApp, "app-2": allocator.KindApp}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Fatalf("listed kinds %v, want %v", kinds, want)
	}
}

// TestSidecarDevicesNotReused: a sidecar takes a finished init
// container's device first, and keeps it: the app container after it gets
// another one. A sidecar's device is not reused by a later init container
// either.
func TestSidecarDevicesNotReused(t *testing.T) {
	const res = "example.com/sidecar"
	m, _, _ := registered(t, res, 4)
	init1 := allocKind(t, m, "pod", "init", allocator.KindInit, res, 1)
	side := allocKind(t, m, "pod", "sidecar", allocator.KindSidecar, res, 1)
	if !slices.Equal(side, init1) {
		t.Fatalf("sidecar got %v, want the init container's %v", side, init1)
	}
	init2 := allocKind(t, m, "pod", "init-after", allocator.KindInit, res, 1)
	app := allocKind(t, m, "pod", "app", allocator.KindApp, res, 1)
	if slices.Equal(init2, side) || slices.Equal(app, side) {
		t.Fatalf("the sidecar's %v taken again: init-after %v, app %v", side, init2, app)
	}
	if !slices.Equal(app, init2) {
		t.Fatalf("app got %v, want init-after's %v", app, init2)
	}
	if n, allocated := free(t, m); n != 2 || len(allocated) != 2 {
		t.Fatalf("free %d, allocated %v; want 2 and 2", n, allocated)
	}
}

// TestReuseWithPreferredAllocation: with a plugin that offers
// GetPreferredAllocation, the shared devices are offered as must-include
// devices, among the free ones, when more are needed (as the kubelet
// does); when they are all that is needed, the plugin is not asked.
func TestReuseWithPreferredAllocation(t *testing.T) {
	const res = "example.com/prefer"
	root := testutil.TempDir(t)
	m := running(t, root, Config{})
	p := plugintest.Start(t, sampleplugin.Options{Resource: res, Devices: 4, Preferred: true, SocketPath: filepath.Join(root, "plugins_registry", "p.sock")})
	if err := m.Register(ctxT(t), Registration{Resource: res, Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g", Path: PathPluginsRegistry}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, res+" allocatable", func() error {
		if rs := m.ListResources(); len(rs) != 1 || rs[0].Allocatable != 4 {
			return fmt.Errorf("resources %+v", rs)
		}
		return nil
	})
	init1 := allocKind(t, m, "pod", "init", allocator.KindInit, res, 2) // the plugin prefers dev-2, dev-3
	asked := p.CallCount(sampleplugin.MethodGetPreferredAllocation)
	app1 := allocKind(t, m, "pod", "app-1", allocator.KindApp, res, 3)
	var pref sampleplugin.Call // the last GetPreferredAllocation
	for _, c := range p.Calls() {
		if c.Method == sampleplugin.MethodGetPreferredAllocation {
			pref = c
		}
	}
	if p.CallCount(sampleplugin.MethodGetPreferredAllocation) != asked+1 || !slices.Equal(pref.MustInclude, init1) ||
		!slices.Equal(pref.DeviceIDs, []string{"dev-0", "dev-1", "dev-2", "dev-3"}) || pref.Size != 3 {
		t.Fatalf("GetPreferredAllocation for app-1: %+v; want must-include %v among all 4", pref, init1)
	}
	if !slices.Contains(app1, init1[0]) || !slices.Contains(app1, init1[1]) {
		t.Fatalf("app-1 got %v, without init's %v", app1, init1)
	}

	// A second pod: its app container's request is all reused.
	init2 := allocKind(t, m, "pod-2", "init", allocator.KindInit, res, 1)
	asked = p.CallCount(sampleplugin.MethodGetPreferredAllocation)
	if app := allocKind(t, m, "pod-2", "app", allocator.KindApp, res, 1); !slices.Equal(app, init2) {
		t.Fatalf("pod-2's app got %v, want its init's %v", app, init2)
	}
	if n := p.CallCount(sampleplugin.MethodGetPreferredAllocation); n != asked {
		t.Fatalf("GetPreferredAllocation called %d times for a request the shared devices complete", n-asked)
	}
}

// reopen closes m and opens a manager again over the same store (a restart
// of the devicemanager), with the plugin p registered again.
func reopen(t *testing.T, m *Manager, p *sampleplugin.Plugin, dpDir string, devices int) *Manager {
	t.Helper()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2, err := Open(ctxT(t), Config{DevicePluginsDir: dpDir, AllowedDirs: []string{filepath.Dir(dpDir)}, Store: store.New(dpDir, store.Options{}), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m2.Close() })
	if err := m2.Register(ctxT(t), Registration{Resource: p.Resource(), Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g2", Path: PathPluginsRegistry}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, p.Resource()+" allocatable again", func() error {
		if rs := m2.ListResources(); len(rs) != 1 || rs[0].Allocatable != int64(devices) {
			return fmt.Errorf("resources %+v", rs)
		}
		return nil
	})
	return m2
}

// TestReuseSurvivesRestart: the kinds are saved with the allocations, so
// a restarted devicemanager still lets an app container take its pod's
// init container's devices, answers a repeated Allocate with the same
// devices without calling the plugin, and still counts a shared device
// once; its mirror of the kubelet's checkpoint lists the shared device
// under each container, as the kubelet's does.
func TestReuseSurvivesRestart(t *testing.T) {
	const res = "example.com/restart"
	m, p, dpDir := registered(t, res, 2)
	init1 := allocKind(t, m, "pod", "init", allocator.KindInit, res, 2)
	m = reopen(t, m, p, dpDir, 2)
	app := allocKind(t, m, "pod", "app", allocator.KindApp, res, 2)
	if !slices.Equal(app, init1) {
		t.Fatalf("after a restart, app got %v, want init's %v", app, init1)
	}
	m = reopen(t, m, p, dpDir, 2)
	calls := p.CallCount(sampleplugin.MethodAllocate)
	for _, c := range []struct {
		name string
		kind allocator.ContainerKind
		want []string
	}{{"init", allocator.KindInit, init1}, {"app", allocator.KindApp, app}} {
		if got := allocKind(t, m, "pod", c.name, c.kind, res, 2); !slices.Equal(got, c.want) {
			t.Fatalf("repeated Allocate of %s after a restart = %v, want %v", c.name, got, c.want)
		}
	}
	if n := p.CallCount(sampleplugin.MethodAllocate); n != calls {
		t.Fatalf("a repeated Allocate called the plugin %d times", n-calls)
	}
	if n, allocated := free(t, m); n != 0 || !slices.Equal(allocated, init1) {
		t.Fatalf("free %d, allocated %v after a restart; want 0 and %v", n, allocated, init1)
	}
	kinds := map[string]allocator.ContainerKind{}
	for _, a := range m.ListAllocations("pod") {
		kinds[a.Container] = a.Kind
	}
	if kinds["init"] != allocator.KindInit || kinds["app"] != allocator.KindApp || len(kinds) != 2 {
		t.Fatalf("kinds after a restart: %v", kinds)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	allocs, _, err := store.ReadKubelet(filepath.Join(dpDir, "kubelet_internal_checkpoint"))
	if err != nil {
		t.Fatal(err)
	}
	if len(allocs) != 2 || !slices.Equal(allocs[0].DeviceIDs, init1) || !slices.Equal(allocs[1].DeviceIDs, init1) {
		t.Fatalf("the kubelet checkpoint mirror holds %+v; want the shared devices under both containers", allocs)
	}
}

// TestReleaseSharedDevices: releasing the init container alone frees
// nothing (the app container still holds its devices) and removes only
// its record; releasing the pod frees each device once; a pod released
// whole frees its shared devices once.
func TestReleaseSharedDevices(t *testing.T) {
	const res = "example.com/release"
	m, p, dpDir := registered(t, res, 3)
	init1 := allocKind(t, m, "pod", "init", allocator.KindInit, res, 2)
	allocKind(t, m, "pod", "app", allocator.KindApp, res, 2)
	allocKind(t, m, "pod", "app-2", allocator.KindApp, res, 1)
	n, err := m.Release(ctxT(t), "pod", "init")
	if err != nil || n != 0 {
		t.Fatalf("Release of the init container = %d, %v; want 0 freed", n, err)
	}
	if f, allocated := free(t, m); f != 0 || len(allocated) != 3 {
		t.Fatalf("after the init container's release: free %d, allocated %v", f, allocated)
	}
	if l := m.ListAllocations("pod"); len(l) != 2 || l[0].Container != "app" || l[1].Container != "app-2" {
		t.Fatalf("allocations after the init container's release: %+v", l)
	}
	// Released, the init container's record is gone for good: a restart
	// gives its devices to no one else, and keeps the app's.
	m = reopen(t, m, p, dpDir, 3)
	if f, allocated := free(t, m); f != 0 || len(allocated) != 3 {
		t.Fatalf("after a restart: free %d, allocated %v", f, allocated)
	}
	if n, err := m.Release(ctxT(t), "pod", ""); err != nil || n != 3 {
		t.Fatalf("Release of the pod = %d, %v; want 3", n, err)
	}
	if f, allocated := free(t, m); f != 3 || len(allocated) != 0 {
		t.Fatalf("after the pod's release: free %d, allocated %v", f, allocated)
	}

	// A whole pod whose init container and app container share two
	// devices: two freed, not four.
	allocKind(t, m, "pod-b", "init", allocator.KindInit, res, 2)
	if app := allocKind(t, m, "pod-b", "app", allocator.KindApp, res, 2); len(app) != 2 || !slices.Equal(app, init1) {
		t.Fatalf("pod-b's app got %v, want %v", app, init1)
	}
	if n, err := m.Release(ctxT(t), "pod-b", ""); err != nil || n != 2 {
		t.Fatalf("Release of pod-b = %d, %v; want 2", n, err)
	}
	if f, _ := free(t, m); f != 3 {
		t.Fatalf("free %d after pod-b's release, want 3", f)
	}
}
