package server

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// gatedPlugin is a device plugin whose ListAndWatch streams, while a gate
// is set, send their first update only once the gate opens: the window
// between a replacement's connection and its first update stays open as
// long as a test needs.
type gatedPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
	devices []*pluginapi.Device

	mu      sync.Mutex
	gate    chan struct{} // nil: no wait
	streams int
}

func (p *gatedPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *gatedPlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	p.mu.Lock()
	gate := p.gate
	p.streams++
	p.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-s.Context().Done():
			return nil
		}
	}
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

func (p *gatedPlugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.GetContainerRequests() {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{})
	}
	return resp, nil
}

// setGate makes the streams opened from now on wait for a new gate, and
// returns the function that opens it.
func (p *gatedPlugin) setGate() (open func()) {
	g := make(chan struct{})
	p.mu.Lock()
	p.gate = g
	p.mu.Unlock()
	return sync.OnceFunc(func() { close(g) })
}

func (p *gatedPlugin) streamCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.streams
}

// sample is one WatchResources change of the sampled resource.
type sample struct {
	allocatable int64
	removed     bool
	endpoints   []*dmv1.Endpoint
}

// sampler follows WatchResources and records every change of one resource,
// from the snapshot on.
type sampler struct {
	mu      sync.Mutex
	samples []sample
	done    chan struct{}
	err     error
}

func startSampler(t *testing.T, client dmv1.DeviceManagerServiceClient, resource string) *sampler {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ws, err := client.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s := &sampler{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			msg, err := ws.Recv()
			if err != nil {
				s.mu.Lock()
				s.err = err
				s.mu.Unlock()
				return
			}
			c := msg.GetChange()
			if c.GetResource().GetName() != resource {
				continue
			}
			s.mu.Lock()
			s.samples = append(s.samples, sample{
				allocatable: c.GetResource().GetAllocatable(),
				removed:     c.GetType() == dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_REMOVED,
				endpoints:   c.GetResource().GetEndpoints(),
			})
			s.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// waitFor waits until a sample satisfies cond.
func (s *sampler) waitFor(t *testing.T, what string, cond func(sample) bool) {
	t.Helper()
	testutil.Eventually(t, what, func() error {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, x := range s.samples {
			if cond(x) {
				return nil
			}
		}
		if s.err != nil {
			return fmt.Errorf("the stream ended: %v", s.err)
		}
		return fmt.Errorf("%d samples", len(s.samples))
	})
}

func (s *sampler) all() []sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sample(nil), s.samples...)
}

// endpointIn reports whether x shows the endpoint of generation gen in
// state st.
func endpointIn(x sample, gen string, st dmv1.EndpointState) bool {
	for _, ep := range x.endpoints {
		if ep.GetGeneration() == gen && ep.GetState() == st {
			return true
		}
	}
	return false
}

// TestReplacementNoDip: a RegisterPlugin with a new generation for an
// endpoint that keeps serving (its registration socket was recreated)
// replaces the endpoint in place. A sampler that records every allocatable
// value WatchResources publishes sees none below the device count: the
// devices stay allocatable from before the replacement, through the new
// connection's wait for its first ListAndWatch update, to after it. Allocate
// works inside that window.
func TestReplacementNoDip(t *testing.T) {
	e := newEnv(t, time.Minute)
	const res, n = "example.com/replace", 4
	p := &gatedPlugin{}
	for i := range n {
		p.devices = append(p.devices, &pluginapi.Device{ID: fmt.Sprintf("dev-%d", i), Health: pluginapi.Healthy})
	}
	ep := filepath.Join(e.regDir, "replace-ep.sock")
	stop := serve(t, ep, func(s *grpc.Server) { pluginapi.RegisterDevicePluginServer(s, p) })
	defer stop()
	register := func(gen string) {
		t.Helper()
		if _, err := e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
			ResourceName: res, Endpoint: ep, Versions: []string{pluginapi.Version},
			SocketPath: filepath.Join(e.regDir, "replace.sock"), Generation: gen,
		}); err != nil {
			t.Fatalf("RegisterPlugin generation %s: %v", gen, err)
		}
	}
	register("g0")
	e.waitCounts(res, n, n)
	s := startSampler(t, e.client, res)
	s.waitFor(t, "the snapshot", func(x sample) bool { return endpointIn(x, "g0", dmv1.EndpointState_ENDPOINT_STATE_LIVE) })

	const rounds = 5
	for i := 1; i <= rounds; i++ {
		gen := fmt.Sprintf("g%d", i)
		open := p.setGate()
		register(gen) // returns with the new stream open, its first update held back
		s.waitFor(t, gen+" connecting", func(x sample) bool { return endpointIn(x, gen, dmv1.EndpointState_ENDPOINT_STATE_CONNECTING) })
		// In the window: the old endpoint is gone, the new one has
		// sent nothing, and the devices are still allocatable.
		r := e.resource(res)
		if r.GetAllocatable() != n || len(r.GetEndpoints()) != 1 || r.GetEndpoints()[0].GetGeneration() != gen {
			t.Fatalf("round %d, before the first update: %v", i, r)
		}
		pod := fmt.Sprintf("pod-%d", i)
		if _, err := e.client.Allocate(ctxT(t), allocReq(pod, "c", res, 1)); err != nil {
			t.Fatalf("round %d: Allocate before the new endpoint's first update: %v", i, err)
		}
		if _, err := e.client.Release(ctxT(t), &dmv1.ReleaseRequest{PodUid: pod}); err != nil {
			t.Fatal(err)
		}
		open()
		s.waitFor(t, gen+" live", func(x sample) bool { return endpointIn(x, gen, dmv1.EndpointState_ENDPOINT_STATE_LIVE) })
	}
	if got := p.streamCount(); got != rounds+1 {
		t.Fatalf("%d ListAndWatch streams, want %d (one per generation)", got, rounds+1)
	}

	samples := s.all()
	for i, x := range samples {
		if x.removed || x.allocatable < n {
			t.Fatalf("sample %d of %d: allocatable %d (removed %v): a dip during the replacements", i, len(samples), x.allocatable, x.removed)
		}
	}
	// The sampler saw each replacement's window, not only its ends.
	for i := 1; i <= rounds; i++ {
		gen := fmt.Sprintf("g%d", i)
		found := false
		for _, x := range samples {
			found = found || endpointIn(x, gen, dmv1.EndpointState_ENDPOINT_STATE_CONNECTING)
		}
		if !found {
			t.Fatalf("no sample of %s connecting", gen)
		}
	}
	t.Logf("%d samples, every allocatable value %d", len(samples), n)

	// A late DeregisterPlugin of a replaced generation removes nothing.
	dr, err := e.client.DeregisterPlugin(ctxT(t), &dmv1.DeregisterPluginRequest{ResourceName: res, Endpoint: ep, Generation: "g1"})
	if err != nil || dr.GetRemoved() {
		t.Fatalf("DeregisterPlugin of a replaced generation: %v, %v; want nothing removed", dr, err)
	}
	if r := e.resource(res); r.GetAllocatable() != n || r.GetEndpoints()[0].GetGeneration() != fmt.Sprintf("g%d", rounds) {
		t.Fatalf("after a stale DeregisterPlugin: %v", r)
	}

	// Control: deregister-then-register, which the reconciler must not do
	// for a recreated socket, is a dip the sampler sees.
	if _, err := e.client.DeregisterPlugin(ctxT(t), &dmv1.DeregisterPluginRequest{
		ResourceName: res, Endpoint: ep, Generation: fmt.Sprintf("g%d", rounds),
	}); err != nil {
		t.Fatal(err)
	}
	register("after-deregister")
	s.waitFor(t, "the dip of a deregistration", func(x sample) bool { return x.allocatable < n })
}
