package claims_test

import (
	"fmt"
	"testing"

	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/server"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/shared/podresources"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

// TestPodResourcesDynamic: the pod resources API lists a pod that holds
// only claims, each container with the devices of the claims and
// requests it references, as the kubelet does.
func TestPodResourcesDynamic(t *testing.T) {
	e := newEnv(t)
	e.claim("two", "a", "b")
	r := podReq("p1", "two")
	r.Containers = []claims.ContainerClaims{
		{Container: "all", Claims: []claims.ContainerClaim{{Name: "c0"}}},
		{Container: "only-b", Claims: []claims.ContainerClaim{{Name: "c0", Request: "b"}}},
	}
	out := e.prepare(r)
	pr := podresources.New(e.core, nil).WithClaims(e.mgr)
	l, err := pr.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil || len(l.PodResources) != 1 {
		t.Fatalf("list: %v, %v", l, err)
	}
	g, err := pr.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: "p1", PodNamespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*podresourcesv1.PodResources{l.PodResources[0], g.PodResources} {
		if p.Name != "p1" || p.Namespace != ns || len(p.Containers) != 2 {
			t.Fatalf("pod: %v", p)
		}
		for i, c := range p.Containers {
			if c.Name != out[i].Container || len(c.DynamicResources) != 1 {
				t.Fatalf("container %d: %v", i, c)
			}
			dr := c.DynamicResources[0]
			if dr.ClaimName != "two" || dr.ClaimNamespace != ns || len(dr.ClaimResources) != len(out[i].Devices) {
				t.Fatalf("container %s: %v", c.Name, dr)
			}
			for j, cr := range dr.ClaimResources {
				d := out[i].Devices[j]
				if cr.DriverName != driverName || cr.PoolName != d.Pool || cr.DeviceName != d.Device.Device ||
					len(cr.CdiDevices) != 1 || cr.CdiDevices[0].Name != d.CDIDeviceIDs[0] {
					t.Fatalf("container %s resource %d: %v, prepared %+v", c.Name, j, cr, d)
				}
			}
		}
	}
	e.release("p1", 1)
	e.waitGone("two")
	if l, err := pr.List(ctx, &podresourcesv1.ListPodResourcesRequest{}); err != nil || len(l.PodResources) != 0 {
		t.Fatalf("after release: %v, %v", l, err)
	}
}

// TestReleaseRPC: DeviceManagerService.Release of a whole pod releases
// its claims and says how many; a container's Release leaves them.
func TestReleaseRPC(t *testing.T) {
	e := newEnv(t)
	e.claim("one", "gpu")
	e.claim("other", "gpu")
	e.prepare(podReq("p1", "one", "other"))
	svc := server.NewService(e.core).WithClaims(e.mgr)
	resp, err := svc.Release(ctx, &dmv1.ReleaseRequest{PodUid: "uid-p1", ContainerName: "main"})
	if err != nil || resp.GetReleasedClaims() != 0 || len(e.mgr.List()) != 2 {
		t.Fatalf("container release: %v, %v, %+v", resp, err, e.mgr.List())
	}
	resp, err = svc.Release(ctx, &dmv1.ReleaseRequest{PodUid: "uid-p1"})
	if err != nil || resp.GetReleasedClaims() != 2 {
		t.Fatalf("pod release: %v, %v", resp, err)
	}
	e.waitGone("one")
	e.waitGone("other")
	for _, c := range []string{"one", "other"} {
		if p, u := e.plugin.counts(c); p != 1 || u != 1 {
			t.Fatalf("%s: %d prepares, %d unprepares", c, p, u)
		}
	}
	if resp, err = svc.Release(ctx, &dmv1.ReleaseRequest{PodUid: "uid-p1"}); err != nil || resp.GetReleasedClaims() != 0 {
		t.Fatal(fmt.Sprint(resp, err))
	}
}
