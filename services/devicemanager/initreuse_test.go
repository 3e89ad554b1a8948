package main

import (
	"path/filepath"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// TestSIGKILLKeepsSharedDevices: an init container's devices, saved with
// its kind, are still shared after a SIGKILL of the devicemanager (the app
// container allocated after the restart takes them), and after a second
// SIGKILL the allocations, the repeated answers and the counts are the
// same; releasing the pod's containers frees each device once, with the
// last container that holds it.
func TestSIGKILLKeepsSharedDevices(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const res = "example.com/shared"
	bin := filepath.Join(buildBinaries(t, "nodeplug-devicemanager"), "nodeplug-devicemanager")
	root := testutil.TempDir(t)
	p := plugintest.Start(t, sampleplugin.Options{Resource: res, Devices: 2, SocketPath: filepath.Join(root, "plugins_registry", "p.sock")})
	first := startProc(t, bin, root)
	if _, err := first.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
		ResourceName: res, Endpoint: p.SocketPath(), Versions: []string{pluginapi.Version},
		SocketPath: p.SocketPath(), Generation: testutil.Generation(t, p.SocketPath()),
	}); err != nil {
		t.Fatal(err)
	}
	waitLive(t, first.client, res, 2)
	initReq := &dmv1.AllocateRequest{PodUid: "pod", ContainerName: "setup", ContainerKind: dmv1.ContainerKind_CONTAINER_KIND_INIT,
		Resources: []*dmv1.ResourceRequest{{ResourceName: res, Count: 2}}}
	appReq := &dmv1.AllocateRequest{PodUid: "pod", ContainerName: "main", ContainerKind: dmv1.ContainerKind_CONTAINER_KIND_APP,
		Resources: []*dmv1.ResourceRequest{{ResourceName: res, Count: 2}}}
	initAnswer, err := first.client.Allocate(ctxT(t), initReq)
	if err != nil {
		t.Fatal(err)
	}
	first.close() // SIGKILL
	if first.Cmd.ProcessState.Success() {
		t.Fatal("the devicemanager exited cleanly; want a SIGKILL")
	}

	second := startProc(t, bin, root)
	waitLive(t, second.client, res, 2)
	appAnswer, err := second.client.Allocate(ctxT(t), appReq)
	if err != nil {
		t.Fatalf("the app container's Allocate after a SIGKILL: %v", err)
	}
	shared := initAnswer.GetAllocations()[0].GetDeviceIds()
	if got := appAnswer.GetAllocations()[0].GetDeviceIds(); !slices.Equal(got, shared) {
		t.Fatalf("the app container got %v after a SIGKILL, want the init container's %v", got, shared)
	}
	before, err := second.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	second.close() // SIGKILL

	third := startProc(t, bin, root)
	if r := waitLive(t, third.client, res, 2); r.GetFree() != 0 || !slices.Equal(r.GetAllocatedDeviceIds(), shared) {
		t.Fatalf("resource after a second SIGKILL: %v; want 0 free, %v allocated", r, shared)
	}
	after, err := third.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	before.InstanceId, after.InstanceId = "", ""
	if !proto.Equal(before, after) {
		t.Fatalf("allocations differ after SIGKILL:\n%v\n%v", before, after)
	}
	calls := p.CallCount(sampleplugin.MethodAllocate)
	for _, c := range []struct {
		req  *dmv1.AllocateRequest
		want *dmv1.AllocateResponse
	}{{initReq, initAnswer}, {appReq, appAnswer}} {
		got, err := third.client.Allocate(ctxT(t), c.req)
		if err != nil || !proto.Equal(got, c.want) {
			t.Fatalf("repeated Allocate of %s = %v, %v; want %v", c.req.GetContainerName(), got, err, c.want)
		}
	}
	if n := p.CallCount(sampleplugin.MethodAllocate); n != calls {
		t.Fatalf("repeated Allocates called the plugin %d times", n-calls)
	}
	// One container at a time (a whole pod's Release asks the dramanager,
	// not running here): the devices are freed with the last holder.
	for _, c := range []struct {
		name string
		want int64
	}{{"setup", 0}, {"main", 2}} {
		rel, err := third.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod", ContainerName: c.name})
		if err != nil || rel.GetReleasedDevices() != c.want {
			t.Fatalf("Release of %s = %v, %v; want %d devices", c.name, rel, err, c.want)
		}
	}
	if r := waitLive(t, third.client, res, 2); r.GetFree() != 2 {
		t.Fatalf("free %d after the release, want 2", r.GetFree())
	}
}
