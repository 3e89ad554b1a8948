package claims_test

import (
	"errors"
	"testing"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/draserver"
)

// TestListPodClaims: ListPodClaims, which the devicemanager reads for the
// pod resources API and a container start, lists a pod's containers with
// the devices and CDI device IDs of the claims and requests each
// references; a pod_uid filter selects the pod; a released pod is gone.
func TestListPodClaims(t *testing.T) {
	e := newEnv(t)
	e.claim("two", "a", "b")
	r := podReq("p1", "two")
	r.Containers = []claims.ContainerClaims{
		{Container: "all", Claims: []claims.ContainerClaim{{Name: "c0"}}},
		{Container: "only-b", Claims: []claims.ContainerClaim{{Name: "c0", Request: "b"}}},
	}
	out := e.prepare(r)
	svc := draserver.NewService("instance", e.reg, nil, draserver.WithPods(e.mgr))
	for _, uid := range []string{"", "uid-p1"} {
		l, err := svc.ListPodClaims(ctx, &dmv1.ListPodClaimsRequest{PodUid: uid})
		if err != nil || len(l.GetPods()) != 1 || l.GetInstanceId() != "instance" {
			t.Fatalf("list %q: %v, %v", uid, l, err)
		}
		p := l.GetPods()[0]
		if p.GetPodUid() != "uid-p1" || p.GetPodName() != "p1" || p.GetPodNamespace() != ns || len(p.GetContainers()) != 2 {
			t.Fatalf("pod: %v", p)
		}
		for i, c := range p.GetContainers() {
			if c.GetName() != out[i].Container || len(c.GetDevices()) != len(out[i].Devices) || len(c.GetCdiDeviceIds()) != len(out[i].CDIDeviceIDs) {
				t.Fatalf("container %d: %v, prepared %+v", i, c, out[i])
			}
			for j, d := range c.GetDevices() {
				w := out[i].Devices[j]
				if d.GetClaimName() != "two" || d.GetClaimNamespace() != ns || d.GetDriver() != driverName || d.GetPool() != w.Pool ||
					d.GetDevice() != w.Device.Device || len(d.GetCdiDeviceIds()) != 1 || d.GetCdiDeviceIds()[0] != w.CDIDeviceIDs[0] {
					t.Fatalf("container %s device %d: %v, prepared %+v", c.GetName(), j, d, w)
				}
			}
		}
	}
	if l, err := svc.ListPodClaims(ctx, &dmv1.ListPodClaimsRequest{PodUid: "uid-other"}); err != nil || len(l.GetPods()) != 0 {
		t.Fatalf("another pod: %v, %v", l, err)
	}
	e.release("p1", 1)
	e.waitGone("two")
	if l, err := svc.ListPodClaims(ctx, &dmv1.ListPodClaimsRequest{}); err != nil || len(l.GetPods()) != 0 {
		t.Fatalf("after release: %v, %v", l, err)
	}
}

// TestReleasePodClaimsRPC: ReleasePodClaims, which the devicemanager calls
// for a Release of a whole pod, releases the pod's claims and says how
// many; a second release finds none; a request without a pod UID is
// refused and releases nothing.
func TestReleasePodClaimsRPC(t *testing.T) {
	e := newEnv(t)
	e.claim("one", "gpu")
	e.claim("other", "gpu")
	e.prepare(podReq("p1", "one", "other"))
	svc := draserver.NewService("instance", e.reg, nil, draserver.WithPods(e.mgr))
	if _, err := svc.ReleasePodClaims(ctx, &dmv1.ReleasePodClaimsRequest{}); !errors.Is(err, errdefs.ErrInvalidArgument) || len(e.mgr.List()) != 2 {
		t.Fatalf("release without a pod: %v, %+v", err, e.mgr.List())
	}
	resp, err := svc.ReleasePodClaims(ctx, &dmv1.ReleasePodClaimsRequest{PodUid: "uid-p1"})
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
	if resp, err = svc.ReleasePodClaims(ctx, &dmv1.ReleasePodClaimsRequest{PodUid: "uid-p1"}); err != nil || resp.GetReleasedClaims() != 0 {
		t.Fatalf("second release: %v, %v", resp, err)
	}
}
