package server

import (
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// TestAllocateContainerKind: over the API, an app container takes the
// devices of its pod's init container (container_kind INIT), the answer
// and ListAllocations give each container's kind (APP when none was
// given), a kind not listed is refused, and a Release of the pod frees
// each shared device once.
func TestAllocateContainerKind(t *testing.T) {
	const res = "example.com/kind"
	e := newEnv(t, time.Minute)
	e.mustRegister(e.plugin("p", sampleplugin.Options{Resource: res, Devices: 2}, false))
	e.waitCounts(res, 2, 2)

	bad := allocReq("pod", "c", res, 1)
	bad.ContainerKind = dmv1.ContainerKind(7)
	if _, err := e.client.Allocate(ctxT(t), bad); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "container kind") {
		t.Fatalf("Allocate with kind 7: %v", err)
	}

	init := allocReq("pod", "init", res, 2)
	init.ContainerKind = dmv1.ContainerKind_CONTAINER_KIND_INIT
	ir, err := e.client.Allocate(ctxT(t), init)
	if err != nil || ir.GetContainerKind() != dmv1.ContainerKind_CONTAINER_KIND_INIT {
		t.Fatalf("Allocate init = %v, %v", ir, err)
	}
	ar, err := e.client.Allocate(ctxT(t), allocReq("pod", "app", res, 2)) // no kind: an app container
	if err != nil || ar.GetContainerKind() != dmv1.ContainerKind_CONTAINER_KIND_APP ||
		!slices.Equal(ar.GetAllocations()[0].GetDeviceIds(), ir.GetAllocations()[0].GetDeviceIds()) {
		t.Fatalf("Allocate app = %v, %v; want init's devices %v", ar, err, ir.GetAllocations()[0].GetDeviceIds())
	}
	if r := e.resource(res); r.GetFree() != 0 || len(r.GetAllocatedDeviceIds()) != 2 {
		t.Fatalf("resource %v; want 0 free, 2 allocated", r)
	}
	list, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{PodUid: "pod"})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, a := range list.GetAllocations() {
		kinds = append(kinds, a.GetContainerName()+"="+a.GetContainerKind().String())
	}
	if want := []string{"app=CONTAINER_KIND_APP", "init=CONTAINER_KIND_INIT"}; !slices.Equal(kinds, want) {
		t.Fatalf("listed %v, want %v", kinds, want)
	}
	rel, err := e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod"})
	if err != nil || rel.GetReleasedDevices() != 2 {
		t.Fatalf("Release = %v, %v; want 2 devices", rel, err)
	}
	if r := e.resource(res); r.GetFree() != 2 {
		t.Fatalf("resource %v after the release; want 2 free", r)
	}
}
