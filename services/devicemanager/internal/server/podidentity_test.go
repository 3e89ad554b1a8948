package server

import (
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

func namedReq(pod, namespace, name, container, resource string, count int64) *dmv1.AllocateRequest {
	r := allocReq(pod, container, resource, count)
	r.PodNamespace, r.PodName = namespace, name
	return r
}

// The first Allocate of a pod UID fixes its namespace and name: later
// requests may repeat them or leave them out, a different pair is refused
// without calling the plugin, and the pair survives a restart.
func TestAllocatePodIdentity(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/id"
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: 8}, false)
	e.mustRegister(p)
	e.waitCounts(res, 8, 8)

	first, err := e.client.Allocate(ctxT(t), namedReq("pod1", "default", "web-0", "c1", res, 1))
	if err != nil {
		t.Fatal(err)
	}
	if first.GetPodNamespace() != "default" || first.GetPodName() != "web-0" {
		t.Fatalf("answer names the pod %q/%q", first.GetPodNamespace(), first.GetPodName())
	}
	// Another container of the pod, without a pair, takes the pod's.
	second, err := e.client.Allocate(ctxT(t), allocReq("pod1", "c2", res, 1))
	if err != nil {
		t.Fatal(err)
	}
	if second.GetPodNamespace() != "default" || second.GetPodName() != "web-0" {
		t.Fatalf("unnamed request of a named pod answers %q/%q", second.GetPodNamespace(), second.GetPodName())
	}
	// The same pair again: the saved answer.
	again, err := e.client.Allocate(ctxT(t), namedReq("pod1", "default", "web-0", "c1", res, 1))
	if err != nil || !proto.Equal(again, first) {
		t.Fatalf("repeat: %v, %v", again, err)
	}
	calls := p.CallCount(sampleplugin.MethodAllocate)
	for _, tc := range []struct{ name, ns, pod, container string }{
		{"other name, saved container", "default", "web-1", "c1"},
		{"other namespace, new container", "prod", "web-0", "c3"},
	} {
		_, err := e.client.Allocate(ctxT(t), namedReq("pod1", tc.ns, tc.pod, tc.container, res, 1))
		if status.Code(err) != codes.FailedPrecondition ||
			!strings.Contains(err.Error(), `pod "pod1" is namespace "default" name "web-0"; this request names namespace "`+tc.ns+`" name "`+tc.pod+`"`) {
			t.Fatalf("%s: %v", tc.name, err)
		}
	}
	if n := p.CallCount(sampleplugin.MethodAllocate); n != calls {
		t.Fatalf("refused requests called the plugin %d times", n-calls)
	}
	// A pod known only by its UID keeps that: naming it later is refused.
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod2", "c", res, 1)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.Allocate(ctxT(t), namedReq("pod2", "default", "late", "c2", res, 1)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("naming a pod known only by UID: %v", err)
	}
	if r := e.resource(res); r.GetFree() != 5 {
		t.Fatalf("refused requests left devices allocated: %v", r)
	}

	list := func() []*dmv1.Allocation {
		t.Helper()
		l, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return l.GetAllocations()
	}
	check := func(when string) {
		t.Helper()
		got := map[string]string{}
		for _, a := range list() {
			got[a.GetPodUid()+"/"+a.GetContainerName()] = a.GetPodNamespace() + "/" + a.GetPodName()
		}
		want := map[string]string{"pod1/c1": "default/web-0", "pod1/c2": "default/web-0", "pod2/c": "/"}
		if len(got) != len(want) {
			t.Fatalf("%s: allocations %v, want %v", when, got, want)
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("%s: allocations %v, want %v", when, got, want)
			}
		}
	}
	check("before restart")
	e.shutdown()
	e.start()
	e.waitCounts(res, 8, 8)
	check("after restart")
	if _, err := e.client.Allocate(ctxT(t), namedReq("pod1", "other", "web-0", "c9", res, 1)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("the restored pod identity was not enforced: %v", err)
	}

	// Once every allocation of a pod is released, its UID may be named anew.
	if _, err := e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod2"}); err != nil {
		t.Fatal(err)
	}
	if a, err := e.client.Allocate(ctxT(t), namedReq("pod2", "default", "late", "c", res, 1)); err != nil || a.GetPodName() != "late" {
		t.Fatalf("a released pod named anew: %v, %v", a, err)
	}
}

func TestAllocatePodIdentityValidation(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/idv"
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: 2}, false)
	e.mustRegister(p)
	e.waitCounts(res, 2, 2)
	for _, tc := range []struct{ name, ns, pod, msg string }{
		{"namespace alone", "default", "", "must be given together"},
		{"name alone", "", "web-0", "must be given together"},
		{"long namespace", strings.Repeat("n", 254), "web-0", "pod namespace"},
		{"long name", "default", strings.Repeat("w", 254), "pod name"},
		{"name with newline", "default", "web\n0", "unprintable"},
		{"namespace with NUL", "def\x00ault", "web-0", "unprintable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.Allocate(ctxT(t), namedReq("pod", tc.ns, tc.pod, "c", res, 1))
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) || len(err.Error()) > 1024 {
				t.Fatalf("err = %v, want InvalidArgument containing %q", err, tc.msg)
			}
		})
	}
	if _, err := e.client.Allocate(ctxT(t), namedReq("pod", strings.Repeat("n", 253), strings.Repeat("w", 253), "c", res, 1)); err != nil {
		t.Fatalf("253-byte namespace and name: %v", err)
	}
	if n := p.CallCount(sampleplugin.MethodAllocate); n != 1 {
		t.Fatalf("plugin Allocate called %d times, want 1", n)
	}
}

// Concurrent Allocates of different containers of one pod naming it
// differently: exactly one pair wins, and every allocation carries it.
func TestAllocatePodIdentityConcurrent(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/idc"
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: 16}, false)
	e.mustRegister(p)
	e.waitCounts(res, 16, 16)
	var wg sync.WaitGroup
	errs := make([]error, 16)
	for i := range 16 {
		wg.Go(func() {
			name := "a"
			if i%2 == 1 {
				name = "b"
			}
			_, errs[i] = e.client.Allocate(ctxT(t), namedReq("pod", "ns", name, "c"+strings.Repeat("x", i), res, 1))
		})
	}
	wg.Wait()
	ok := 0
	for _, err := range errs {
		switch status.Code(err) {
		case codes.OK:
			ok++
		case codes.FailedPrecondition:
		default:
			t.Fatalf("unexpected error %v", err)
		}
	}
	l, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{PodUid: "pod"})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.GetAllocations()) != ok || ok < 8 {
		t.Fatalf("%d allocations listed, %d succeeded", len(l.GetAllocations()), ok)
	}
	for _, a := range l.GetAllocations() {
		if a.GetPodName() != l.GetAllocations()[0].GetPodName() || a.GetPodNamespace() != "ns" {
			t.Fatalf("one pod with two identities: %v", l.GetAllocations())
		}
	}
	if r := e.resource(res); r.GetFree() != int64(16-ok) {
		t.Fatalf("free = %d after %d allocations", r.GetFree(), ok)
	}
}
