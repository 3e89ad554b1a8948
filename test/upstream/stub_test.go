package upstream

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

func allocate(t *testing.T, d *dm, pod, resource string, count int64) (*dmv1.ResourceAllocation, error) {
	t.Helper()
	resp, err := d.client.Allocate(ctxT(t), &dmv1.AllocateRequest{PodUid: pod, ContainerName: "c", Resources: []*dmv1.ResourceRequest{
		{ResourceName: resource, Count: count},
	}})
	if err != nil {
		return nil, err
	}
	return resp.GetAllocations()[0], nil
}

// TestStubRegistersOnKubeletSock: the upstream Stub registers on
// kubelet.sock (no DEPRECATION file stops it), its devices are allocatable,
// and after a devicemanager restart re-creates kubelet.sock the Stub's own
// Watch restarts its server and registers again, as with a kubelet: the
// endpoint is the new socket, live, its devices allocatable.
func TestStubRegistersOnKubeletSock(t *testing.T) {
	d := startDM(t)
	const res = "example.com/stub"
	s := d.newStub("stub", res, false, []string{"dev-1", "dev-2", "dev-3"}, nil)
	// The Stub's Watch never returns, and once Stop closes its fsnotify
	// watcher it spins on the closed channel: this Stub is left serving
	// until the test binary exits (its socket goes with the temp dir).
	ctx := klog.NewContext(context.Background(), logger())
	pluginDir := d.dpDir + string(filepath.Separator) // as pluginapi.DevicePluginPath, for the DEPRECATION check
	if err := s.Register(ctx, d.kubeletSock(), res, pluginDir); err != nil {
		t.Fatalf("Stub Register: %v", err)
	}
	r := d.waitLive(res, 3, nil)
	ep := r.GetEndpoints()[0]
	if ep.GetEndpoint() != filepath.Join(d.dpDir, "stub.sock") || ep.GetRegistrationPath() != dmv1.RegistrationPath_REGISTRATION_PATH_KUBELET_SOCK {
		t.Fatalf("endpoint = %v", ep)
	}
	first := ep.GetGeneration()
	a, err := allocate(t, d, "pod-1", res, 2)
	if err != nil || !slices.Equal(a.GetDeviceIds(), []string{"dev-1", "dev-2"}) ||
		a.GetContainerResponse().GetEnvs()["STUB_DEVICES"] != "[dev-1 dev-2]" {
		t.Fatalf("Allocate: %v, %v", a, err)
	}
	go s.Watch(ctx, d.kubeletSock(), res, pluginDir)

	// A devicemanager restart: the recorded endpoint is redialled before
	// the API serves; the new kubelet.sock makes the Stub restart its
	// server (a new socket) and register again.
	d.kill()
	d.start()
	r = d.resource(res)
	if len(r.GetEndpoints()) != 1 || r.GetEndpoints()[0].GetGeneration() != first {
		t.Fatalf("after the restart, before the Stub registered again: %v", r)
	}
	r = d.waitLive(res, 3, func(ep *dmv1.Endpoint) bool { return ep.GetGeneration() != first })
	if ep := r.GetEndpoints()[0]; ep.GetEndpoint() != filepath.Join(d.dpDir, "stub.sock") ||
		ep.GetRegistrationPath() != dmv1.RegistrationPath_REGISTRATION_PATH_KUBELET_SOCK {
		t.Fatalf("endpoint after the Stub registered again = %v", ep)
	}
	// The allocation survived the restart; the rest of the devices
	// allocate through the new endpoint.
	if a, err := allocate(t, d, "pod-1", res, 2); err != nil || !slices.Equal(a.GetDeviceIds(), []string{"dev-1", "dev-2"}) {
		t.Fatalf("the allocation after the restart: %v, %v", a, err)
	}
	if a, err := allocate(t, d, "pod-2", res, 1); err != nil || !slices.Equal(a.GetDeviceIds(), []string{"dev-3"}) {
		t.Fatalf("Allocate through the re-registered Stub: %v, %v", a, err)
	}
}

// preferredCalls records the GetPreferredAllocation requests a Stub got.
type preferredCalls struct {
	mu   sync.Mutex
	reqs []*pluginapi.ContainerPreferredAllocationRequest
}

func (c *preferredCalls) answer(ids []string, err error) func(*pluginapi.PreferredAllocationRequest, map[string]*pluginapi.Device) (*pluginapi.PreferredAllocationResponse, error) {
	return func(r *pluginapi.PreferredAllocationRequest, _ map[string]*pluginapi.Device) (*pluginapi.PreferredAllocationResponse, error) {
		c.mu.Lock()
		c.reqs = append(c.reqs, r.GetContainerRequests()...)
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return &pluginapi.PreferredAllocationResponse{ContainerResponses: []*pluginapi.ContainerPreferredAllocationResponse{{DeviceIDs: ids}}}, nil
	}
}

func (c *preferredCalls) all() []*pluginapi.ContainerPreferredAllocationRequest {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.reqs)
}

// TestStubPreferredAnswers: whatever a Stub's GetPreferredAllocation
// answers — its default empty answer, a short one, one naming devices that
// were not offered, a long one — allocates as the kubelet's
// devicesToAllocate would: the answered IDs that are available, in the
// plugin's order, up to the count, then the lowest IDs. Only a failed call
// fails the allocation.
func TestStubPreferredAnswers(t *testing.T) {
	d := startDM(t)
	ids := []string{"a", "b", "c", "d"}
	tests := []struct {
		name        string
		stubDefault bool // the Stub's own answer: an empty response
		answer      []string
		want        []string
	}{
		{name: "stub default (empty)", stubDefault: true, want: []string{"a", "b"}},
		{name: "empty", answer: []string{}, want: []string{"a", "b"}},
		{name: "as answered", answer: []string{"d", "c"}, want: []string{"c", "d"}},
		{name: "short", answer: []string{"d"}, want: []string{"a", "d"}},
		{name: "foreign", answer: []string{"zz", "c"}, want: []string{"a", "c"}},
		{name: "only foreign", answer: []string{"x", "y"}, want: []string{"a", "b"}},
		{name: "long", answer: []string{"d", "b", "c"}, want: []string{"b", "d"}},
		{name: "repeated", answer: []string{"c", "c"}, want: []string{"a", "c"}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := fmt.Sprintf("example.com/pref%d", i)
			calls := &preferredCalls{}
			s := d.newStub(fmt.Sprintf("pref%d", i), res, true, ids, func(s *plugin.Stub) {
				if !tc.stubDefault {
					s.SetGetPreferredAllocFunc(calls.answer(tc.answer, nil))
				}
			})
			t.Cleanup(func() { _ = s.Stop(logger()) })
			if err := s.Register(klog.NewContext(context.Background(), logger()), d.kubeletSock(), res, ""); err != nil {
				t.Fatalf("Stub Register: %v", err)
			}
			d.waitLive(res, 4, func(ep *dmv1.Endpoint) bool { return ep.GetOptions().GetGetPreferredAllocationAvailable() })
			a, err := allocate(t, d, "pod", res, 2)
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			if !slices.Equal(a.GetDeviceIds(), tc.want) || a.GetContainerResponse().GetEnvs()["STUB_DEVICES"] != fmt.Sprint(tc.want) {
				t.Fatalf("allocated %v (plugin saw %v), want %v", a.GetDeviceIds(), a.GetContainerResponse().GetEnvs(), tc.want)
			}
			if tc.stubDefault {
				return
			}
			reqs := calls.all()
			if len(reqs) != 1 || !slices.Equal(reqs[0].GetAvailableDeviceIDs(), ids) || reqs[0].GetAllocationSize() != 2 {
				t.Fatalf("GetPreferredAllocation requests = %v", reqs)
			}
		})
	}

	t.Run("failed call", func(t *testing.T) {
		const res = "example.com/preffail"
		calls := &preferredCalls{}
		s := d.newStub("preffail", res, true, ids, func(s *plugin.Stub) {
			s.SetGetPreferredAllocFunc(calls.answer(nil, errors.New("stub says no")))
		})
		t.Cleanup(func() { _ = s.Stop(logger()) })
		if err := s.Register(klog.NewContext(context.Background(), logger()), d.kubeletSock(), res, ""); err != nil {
			t.Fatalf("Stub Register: %v", err)
		}
		d.waitLive(res, 4, nil)
		_, err := allocate(t, d, "pod", res, 2)
		if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "GetPreferredAllocation rpc failed with err: stub says no") {
			t.Fatalf("Allocate with a failing GetPreferredAllocation: %v; want Internal with the plugin's message", err)
		}
		if r := d.resource(res); r.GetFree() != 4 {
			t.Fatalf("a failed allocation left devices taken: %v", r)
		}
	})
}

// TestEndpointAppearsLate: a Register on kubelet.sock that names an
// endpoint whose file does not exist yet waits for it, as the kubelet's
// dial does; a Stub that starts serving it 2 s later is registered.
func TestEndpointAppearsLate(t *testing.T) {
	d := startDM(t)
	const res = "example.com/late"
	conn, err := rpcutil.DialPeer(d.kubeletSock())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	done := make(chan error, 1)
	go func() {
		_, err := pluginapi.NewRegistrationClient(conn).Register(ctxT(t), &pluginapi.RegisterRequest{
			Version: pluginapi.Version, Endpoint: "late.sock", ResourceName: res,
		})
		done <- err
	}()
	testutil.WaitFor(t, "the devicemanager waiting for the endpoint", func() bool {
		return len(d.procs.Process("devicemanager").LogLines("device plugin endpoint does not exist yet")) > 0
	})
	select {
	case err := <-done:
		t.Fatalf("Register returned before the endpoint existed: %v", err)
	default:
	}
	// The scenario's delay: the plugin creates its endpoint 2 s after it
	// registered (not a synchronisation).
	<-time.After(2 * time.Second)
	s := d.newStub("late", res, false, []string{"x"}, nil)
	t.Cleanup(func() { _ = s.Stop(logger()) })
	if err := <-done; err != nil {
		t.Fatalf("Register of an endpoint that appeared 2 s later: %v", err)
	}
	d.waitLive(res, 1, nil)
}
