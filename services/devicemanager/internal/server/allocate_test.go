package server

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

func allocReq(pod, container, resource string, count int64, must ...string) *dmv1.AllocateRequest {
	return &dmv1.AllocateRequest{PodUid: pod, ContainerName: container, Resources: []*dmv1.ResourceRequest{{
		ResourceName: resource, Count: count, MustIncludeDeviceIds: must,
	}}}
}

func TestAllocateValidation(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/v", Devices: 2}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/v", 2, 2)
	tests := []struct {
		name string
		req  *dmv1.AllocateRequest
		code codes.Code
		msg  string
	}{
		{"empty pod", allocReq("", "c", "example.com/v", 1), codes.InvalidArgument, "pod UID"},
		{"long pod", allocReq(strings.Repeat("p", 254), "c", "example.com/v", 1), codes.InvalidArgument, "pod UID"},
		{"empty container", allocReq("pod", "", "example.com/v", 1), codes.InvalidArgument, "container name"},
		{"zero count", allocReq("pod", "c", "example.com/v", 0), codes.InvalidArgument, "must be > 0"},
		{"negative count", allocReq("pod", "c", "example.com/v", -1), codes.InvalidArgument, "must be > 0"},
		{"no resources", &dmv1.AllocateRequest{PodUid: "pod", ContainerName: "c"}, codes.InvalidArgument, "no resources"},
		{"must exceeds count", allocReq("pod", "c", "example.com/v", 1, "dev-0", "dev-1"), codes.InvalidArgument, "exceed the count"},
		{"unknown resource", allocReq("pod", "c", "example.com/none", 1), codes.NotFound, "cannot allocate unregistered device example.com/none"},
		{"too few", allocReq("pod", "c", "example.com/v", 3), codes.FailedPrecondition,
			"requested number of devices unavailable for example.com/v. Requested: 3, Available: 2"},
		{"must unknown", allocReq("pod", "c", "example.com/v", 1, "dev-9"), codes.FailedPrecondition, `must-include device "dev-9"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.Allocate(ctxT(t), tc.req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("err = %v, want %v containing %q", err, tc.code, tc.msg)
			}
		})
	}
	if n := p.CallCount(sampleplugin.MethodAllocate); n != 0 {
		t.Fatalf("plugin Allocate called %d times for rejected requests", n)
	}
	if r := e.resource("example.com/v"); r.GetFree() != 2 {
		t.Fatalf("rejected requests left devices allocated: %v", r)
	}
}

func TestAllocateLowestIDsIdempotentAndRelease(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/a"
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: 4}, false)
	e.mustRegister(p)
	e.waitCounts(res, 4, 4)

	first, err := e.client.Allocate(ctxT(t), allocReq("pod1", "c1", res, 2))
	if err != nil {
		t.Fatal(err)
	}
	a := first.GetAllocations()[0]
	if !slices.Equal(a.GetDeviceIds(), []string{"dev-0", "dev-1"}) {
		t.Fatalf("devices = %v, want the lowest IDs", a.GetDeviceIds())
	}
	if a.GetContainerResponse().GetEnvs()["NODEPLUG_DEVICES"] != "dev-0,dev-1" || len(a.GetContainerResponse().GetMounts()) != 2 ||
		len(a.GetContainerResponse().GetDevices()) != 2 || a.GetContainerResponse().GetAnnotations()["nodeplug.io/resource"] != res {
		t.Fatalf("container response = %v", a.GetContainerResponse())
	}
	for _, d := range a.GetDevices() {
		if d.GetHealth() != dmv1.DeviceHealth_DEVICE_HEALTH_HEALTHY {
			t.Fatalf("device health = %v", a.GetDevices())
		}
	}
	again, err := e.client.Allocate(ctxT(t), allocReq("pod1", "c1", res, 2))
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(first, again) {
		t.Fatalf("repeated Allocate answered differently:\n%v\n%v", first, again)
	}
	if n := p.CallCount(sampleplugin.MethodAllocate); n != 1 {
		t.Fatalf("plugin Allocate called %d times, want 1", n)
	}
	_, err = e.client.Allocate(ctxT(t), allocReq("pod1", "c1", res, 3))
	if status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), `pod "pod1" container "c1" changed request for resource "example.com/a" from 2 to 3`) {
		t.Fatalf("changed count: %v", err)
	}
	r := e.resource(res)
	if r.GetFree() != 2 || !slices.Equal(r.GetAllocatedDeviceIds(), []string{"dev-0", "dev-1"}) {
		t.Fatalf("resource = %v", r)
	}
	// Taken devices cannot be must-included; free ones can.
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod2", "c1", res, 1, "dev-1")); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("must-include of an allocated device: %v", err)
	}
	must, err := e.client.Allocate(ctxT(t), allocReq("pod2", "c1", res, 2, "dev-3"))
	if err != nil {
		t.Fatal(err)
	}
	if got := must.GetAllocations()[0].GetDeviceIds(); !slices.Equal(got, []string{"dev-2", "dev-3"}) {
		t.Fatalf("must-include answer = %v", got)
	}
	// Everything is taken now.
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod3", "c1", res, 1)); status.Code(err) != codes.FailedPrecondition ||
		!strings.Contains(err.Error(), "Requested: 1, Available: 0") {
		t.Fatalf("allocate with nothing free: %v", err)
	}

	list, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil || len(list.GetAllocations()) != 2 || list.GetAllocations()[0].GetPodUid() != "pod1" ||
		!proto.Equal(list.GetAllocations()[0].GetContainerResponse(), a.GetContainerResponse()) || list.GetAllocations()[0].GetTraceId() == "" {
		t.Fatalf("ListAllocations = %v, %v", list, err)
	}
	rel, err := e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod1", ContainerName: "c1"})
	if err != nil || rel.GetReleasedDevices() != 2 {
		t.Fatalf("release: %v, %v", rel, err)
	}
	rel, err = e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: "pod1"})
	if err != nil || rel.GetReleasedDevices() != 0 {
		t.Fatalf("second release: %v, %v", rel, err)
	}
	if r := e.resource(res); r.GetFree() != 2 {
		t.Fatalf("after release: %v", r)
	}
	// A released container allocates anew (and calls the plugin again).
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod1", "c1", res, 2)); err != nil {
		t.Fatal(err)
	}
	if n := p.CallCount(sampleplugin.MethodAllocate); n != 3 {
		t.Fatalf("plugin Allocate called %d times, want 3", n)
	}
}

func TestAllocatePreferredPreStartCDI(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/pref"
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: 4, Preferred: true, PreStartRequired: true, CDI: true}, false)
	e.mustRegister(p)
	e.waitCounts(res, 4, 4)

	resp, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", res, 2, "dev-0"))
	if err != nil {
		t.Fatal(err)
	}
	a := resp.GetAllocations()[0]
	if !slices.Equal(a.GetDeviceIds(), []string{"dev-0", "dev-3"}) {
		t.Fatalf("devices = %v, want the plugin's preference (dev-0 and the highest)", a.GetDeviceIds())
	}
	calls := p.Calls()
	i := slices.IndexFunc(calls, func(c sampleplugin.Call) bool { return c.Method == sampleplugin.MethodGetPreferredAllocation })
	if i < 0 || !slices.Equal(calls[i].DeviceIDs, []string{"dev-0", "dev-1", "dev-2", "dev-3"}) ||
		!slices.Equal(calls[i].MustInclude, []string{"dev-0"}) || calls[i].Size != 2 {
		t.Fatalf("GetPreferredAllocation call = %+v", calls)
	}
	var cdi []string
	for _, c := range a.GetContainerResponse().GetCdiDevices() {
		cdi = append(cdi, c.GetName())
	}
	if !slices.Equal(cdi, []string{"example.com/pref=dev-0", "example.com/pref=dev-3"}) {
		t.Fatalf("CDI devices = %v", cdi)
	}
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", res, 2, "dev-0")); err != nil {
		t.Fatal(err)
	}
	// PreStartContainer belongs to the container's start (start_test.go).
	if n := p.CallCount(sampleplugin.MethodPreStartContainer); n != 0 {
		t.Fatalf("Allocate called PreStartContainer %d times, want 0", n)
	}
}

// A preferred answer is used as the kubelet uses it (devicesToAllocate):
// must-include first, the answered IDs that are available in the plugin's
// order, the rest by default. A short, empty or foreign answer allocates,
// with a warning naming the plugin; only a failed call fails.
func TestAllocatePreferredAnswerAsKubelet(t *testing.T) {
	e := newEnv(t, time.Minute)
	avail := []string{"a", "b", "c", "d"}
	tests := []struct {
		name   string
		answer []string
		must   []string
		want   []string
		warn   bool
	}{
		{"as answered", []string{"d", "c"}, nil, []string{"c", "d"}, false},
		{"empty", []string{}, nil, []string{"a", "b"}, true},
		{"short", []string{"d"}, nil, []string{"a", "d"}, true},
		{"foreign", []string{"zz", "c"}, nil, []string{"a", "c"}, true},
		{"must-include missing", []string{"b", "c"}, []string{"d"}, []string{"b", "d"}, true},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := fmt.Sprintf("example.com/pref%d", i)
			p := e.plugin(fmt.Sprintf("pref%d", i), sampleplugin.Options{Resource: res, DeviceIDs: avail, Preferred: true}, false)
			e.mustRegister(p)
			e.waitCounts(res, 4, 4)
			p.SetPreference(tc.answer)
			resp, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", res, 2, tc.must...))
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			if got := resp.GetAllocations()[0].GetDeviceIds(); !slices.Equal(got, tc.want) {
				t.Fatalf("devices = %v, want %v", got, tc.want)
			}
			calls := p.Calls()
			j := slices.IndexFunc(calls, func(c sampleplugin.Call) bool { return c.Method == sampleplugin.MethodAllocate })
			if j < 0 || !slices.Equal(calls[j].DeviceIDs, tc.want) {
				t.Fatalf("plugin Allocate call = %+v, want %v", calls, tc.want)
			}
			plugin := res + " (" + p.SocketPath() + ")"
			warned := e.logs.has("device plugin's preferred allocation not used as answered; the rest chosen by default", "plugin", plugin)
			if warned != tc.warn {
				t.Fatalf("warning naming %s logged: %v, want %v; log:\n%s", plugin, warned, tc.warn, e.logs)
			}
		})
	}
	t.Run("failed call", func(t *testing.T) {
		const res = "example.com/preffail"
		p := e.plugin("preffail", sampleplugin.Options{Resource: res, DeviceIDs: avail, Preferred: true}, false)
		e.mustRegister(p)
		e.waitCounts(res, 4, 4)
		p.SetFailure(sampleplugin.MethodGetPreferredAllocation, status.Error(codes.Unavailable, "plugin says no"))
		_, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", res, 2))
		if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "GetPreferredAllocation rpc failed with err: plugin says no") {
			t.Fatalf("err = %v, want Unavailable with the plugin's message", err)
		}
		if r := e.resource(res); r.GetFree() != 4 || p.CallCount(sampleplugin.MethodAllocate) != 0 {
			t.Fatalf("a failed GetPreferredAllocation left state: %v", r)
		}
	})
}

func TestAllocatePluginErrorRollsBack(t *testing.T) {
	e := newEnv(t, time.Minute)
	p1 := e.plugin("p1", sampleplugin.Options{Resource: "example.com/ok", Devices: 2}, false)
	p2 := e.plugin("p2", sampleplugin.Options{Resource: "example.com/fail", Devices: 2}, false)
	e.mustRegister(p1)
	e.mustRegister(p2)
	e.waitCounts("example.com/ok", 2, 2)
	e.waitCounts("example.com/fail", 2, 2)
	req := &dmv1.AllocateRequest{PodUid: "pod", ContainerName: "c", Resources: []*dmv1.ResourceRequest{
		{ResourceName: "example.com/ok", Count: 1}, {ResourceName: "example.com/fail", Count: 1},
	}}
	for _, tc := range []struct {
		method string
		code   codes.Code
		msg    string
		reason string
	}{
		{sampleplugin.MethodAllocate, codes.Internal, "Allocate rpc failed with err: plugin says no", errdefs.ReasonDevicePluginFailed},
		{sampleplugin.MethodAllocate, codes.Unavailable, "Allocate rpc failed with err: plugin says no", errdefs.ReasonDevicePluginUnreachable},
	} {
		t.Run(tc.method+" "+tc.code.String(), func(t *testing.T) {
			p2.SetFailure(tc.method, status.Error(tc.code, "plugin says no"))
			defer p2.SetFailure(tc.method, nil)
			_, err := e.client.Allocate(ctxT(t), req)
			if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want %v with %q", err, tc.code, tc.msg)
			}
			// The status says the plugin is at fault, and which one.
			info, ok := errdefs.InfoOf(err)
			if md := info.GetMetadata(); !ok || info.GetReason() != tc.reason || md[errdefs.MetaResource] != "example.com/fail" ||
				md[errdefs.MetaSocket] != p2.SocketPath() || md[errdefs.MetaCall] != "Allocate" {
				t.Fatalf("error info %v, want reason %s naming example.com/fail, its socket %s and Allocate", info, tc.reason, p2.SocketPath())
			}
			for _, name := range []string{"example.com/ok", "example.com/fail"} {
				if r := e.resource(name); r.GetFree() != 2 || len(r.GetAllocatedDeviceIds()) != 0 {
					t.Fatalf("failure left %s allocated: %v", name, r)
				}
			}
			if l, _ := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{}); len(l.GetAllocations()) != 0 {
				t.Fatalf("allocations after a failure: %v", l)
			}
		})
	}
	resp, err := e.client.Allocate(ctxT(t), req)
	if err != nil || len(resp.GetAllocations()) != 2 {
		t.Fatalf("allocate after the plugin recovered: %v, %v", resp, err)
	}
}

func TestAllocateConcurrentNeverDoubleAllocates(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res = "example.com/many"
	const devices, calls = 64, 1000
	p := e.plugin("p", sampleplugin.Options{Resource: res, Devices: devices}, false)
	e.mustRegister(p)
	e.waitCounts(res, devices, devices)

	var mu sync.Mutex
	owner := map[string]string{}
	podDev := map[string]string{}
	var ok, refused int
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			pod := fmt.Sprintf("pod-%d", i%(calls/2)) // every pod asks twice: identical requests
			resp, err := e.client.Allocate(ctxT(t), allocReq(pod, "c", res, 1))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if status.Code(err) != codes.FailedPrecondition {
					t.Errorf("%s: %v", pod, err)
				}
				refused++
				return
			}
			ok++
			id := resp.GetAllocations()[0].GetDeviceIds()[0]
			if o, taken := owner[id]; taken && o != pod {
				t.Errorf("device %s given to %s and %s", id, o, pod)
			}
			owner[id] = pod
			if d, ok := podDev[pod]; ok && d != id {
				t.Errorf("identical requests of %s answered %s and %s", pod, d, id)
			}
			podDev[pod] = id
		})
	}
	wg.Wait()
	if len(owner) != devices {
		t.Fatalf("%d devices allocated, want %d", len(owner), devices)
	}
	if n := p.CallCount(sampleplugin.MethodAllocate); n != devices {
		t.Fatalf("plugin Allocate called %d times, want %d (one per allocation)", n, devices)
	}
	list, err := e.client.ListAllocations(ctxT(t), &dmv1.ListAllocationsRequest{})
	if err != nil || len(list.GetAllocations()) != devices {
		t.Fatalf("ListAllocations: %d, %v", len(list.GetAllocations()), err)
	}
	if r := e.resource(res); r.GetFree() != 0 || len(r.GetAllocatedDeviceIds()) != devices {
		t.Fatalf("resource = %v", r)
	}
	t.Logf("%d answers with devices (identical requests included), %d refused", ok, refused)
}
