package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// plugin is one device plugin the harness runs.
type plugin struct {
	*sampleplugin.Plugin
	resource   string
	socket     string
	registry   bool // plugins_registry; else kubelet.sock
	stable     bool // never churned: allocated from, watched for dips
	registered bool // kubelet.sock plugins: Register acknowledged
}

func (h *harness) kubeletSock() string {
	return layout.KubeletSocket(h.root)
}

// newPlugin starts a plugin; a kubelet.sock one is registered by register.
func (h *harness) newPlugin(registry, stable bool) (*plugin, error) {
	h.mu.Lock()
	h.seq++
	n := h.seq
	h.mu.Unlock()
	p := &plugin{resource: fmt.Sprintf("chaos.example.com/r%d", n), registry: registry, stable: stable}
	if registry {
		p.socket = filepath.Join(layout.PluginsRegistryDir(h.root), fmt.Sprintf("dp-%d.sock", n))
	} else {
		p.socket = filepath.Join(layout.DevicePluginsDir(h.root), fmt.Sprintf("dp-%d.sock", n))
	}
	dp, err := sampleplugin.New(sampleplugin.Options{Resource: p.resource, SocketPath: p.socket, Devices: h.cfg.Devices})
	if err != nil {
		return nil, err
	}
	p.Plugin = dp
	if err := dp.Start(); err != nil {
		return nil, err
	}
	return p, nil
}

// register makes one attempt to register the kubelet.sock plugins not yet
// registered. Callers hold h.pause.
func (h *harness) register(ctx context.Context) {
	h.mu.Lock()
	var todo []*plugin
	for _, p := range h.plugins {
		if !p.registry && !p.registered {
			todo = append(todo, p)
		}
	}
	h.mu.Unlock()
	for _, p := range todo {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := p.Register(rctx, h.kubeletSock())
		cancel()
		if err == nil {
			h.mu.Lock()
			p.registered = true
			h.mu.Unlock()
		}
	}
}

func (h *harness) startPlugins(ctx context.Context) error {
	churnable := max(2, h.cfg.Plugins/5)
	for i := range h.cfg.Plugins {
		p, err := h.newPlugin(i%2 == 0, i < h.cfg.Plugins-churnable)
		if err != nil {
			return err
		}
		h.mu.Lock()
		h.plugins = append(h.plugins, p)
		h.mu.Unlock()
	}
	h.register(ctx)
	h.logf("plugins: %d (%d churned), %d devices each", h.cfg.Plugins, churnable, h.cfg.Devices)
	return nil
}

func (h *harness) stopPlugins() {
	h.mu.Lock()
	ps := h.plugins
	h.plugins = nil
	h.mu.Unlock()
	for _, p := range ps {
		p.Stop()
	}
}

// churn replaces a random churnable plugin with a new one, on the same
// registration path, every quarter interval.
func (h *harness) churn(ctx context.Context, errc chan<- error) {
	t := time.NewTicker(max(h.cfg.Interval/4, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.pause.RLock()
		h.mu.Lock()
		var churnable []int
		for i, p := range h.plugins {
			if !p.stable {
				churnable = append(churnable, i)
			}
		}
		var old *plugin
		if len(churnable) > 0 {
			i := churnable[h.intn(len(churnable))]
			old = h.plugins[i]
			h.plugins = append(h.plugins[:i:i], h.plugins[i+1:]...)
			h.res.Churned++
		}
		h.mu.Unlock()
		if old != nil {
			old.Stop()
			p, err := h.newPlugin(old.registry, false)
			if err != nil {
				h.pause.RUnlock()
				errc <- err
				return
			}
			h.mu.Lock()
			h.plugins = append(h.plugins, p)
			h.mu.Unlock()
			h.register(ctx)
		}
		h.pause.RUnlock()
	}
}

// stableResources returns the resources clients allocate from.
func (h *harness) stableResources() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, p := range h.plugins {
		if p.stable {
			out = append(out, p.resource)
		}
	}
	return out
}

// definite says whether an Allocate error means nothing was allocated.
func definite(err error) bool {
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.NotFound, codes.InvalidArgument, codes.AlreadyExists:
		return true
	}
	return false
}

// allocate makes one Allocate of count devices for a new pod and records an
// acknowledged answer. It returns the pod, and whether it may hold devices.
func (h *harness) allocate(ctx context.Context, pod, resource string, count int64) (bool, error) {
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := h.dm.Allocate(actx, &dmv1.AllocateRequest{PodUid: pod, ContainerName: "c",
		Resources: []*dmv1.ResourceRequest{{ResourceName: resource, Count: count}}})
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil {
		if definite(err) {
			return false, err
		}
		h.res.Uncertain++
		return true, err
	}
	h.res.Acked++
	for _, a := range resp.GetAllocations() {
		h.acked[AllocKey{Pod: pod, Container: "c", Resource: a.GetResourceName()}] = a.GetDeviceIds()
	}
	return true, nil
}

// release releases a pod; once acknowledged, none of its allocations may
// be listed again. The pod stops being required before the call.
func (h *harness) release(ctx context.Context, pod string) bool {
	h.mu.Lock()
	for k := range h.acked {
		if k.Pod == pod {
			delete(h.acked, k)
		}
	}
	h.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := h.dm.Release(rctx, &dmv1.ReleaseRequest{PodUid: pod})
	if err != nil {
		return false
	}
	h.mu.Lock()
	h.released[pod] = true
	if resp.GetReleasedDevices() > 0 {
		h.res.Released++
	}
	h.mu.Unlock()
	return true
}

// releaseAll releases pods, retrying each for a while.
func (h *harness) releaseAll(ctx context.Context, pods []string) error {
	for _, p := range pods {
		for try := 0; !h.release(ctx, p); try++ {
			if try == 50 {
				return fmt.Errorf("release %s: no answer after %d tries", p, try)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return nil
}

// client allocates for new pods and releases old ones, keeping up to eight
// pods, until ctx ends. Pods whose answer was lost are released too.
func (h *harness) client(ctx context.Context, id int) {
	var held []string
	// At the end, release what is held, so that later phases find free
	// devices.
	defer func() { _ = h.releaseAll(context.WithoutCancel(ctx), held) }()
	n := 0
	for ctx.Err() == nil {
		h.pause.RLock()
		if len(held) >= 8 || len(held) > 0 && h.intn(5) < 2 {
			i := h.intn(len(held))
			if h.release(ctx, held[i]) {
				held = append(held[:i], held[i+1:]...)
			}
		} else if rs := h.stableResources(); len(rs) > 0 {
			n++
			pod := fmt.Sprintf("pod-%d-%d", id, n)
			if holds, _ := h.allocate(ctx, pod, rs[h.intn(len(rs))], int64(1+h.intn(2))); holds {
				held = append(held, pod)
			}
		}
		h.pause.RUnlock()
	}
}

// snapshot lists what the services report.
func (h *harness) snapshot(ctx context.Context) (State, error) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var s State
	pl, err := h.rc.ListPlugins(lctx, &rcv1.ListPluginsRequest{})
	if err != nil {
		return s, fmt.Errorf("ListPlugins: %w", err)
	}
	rs, err := h.dm.ListResources(lctx, &dmv1.ListResourcesRequest{})
	if err != nil {
		return s, fmt.Errorf("ListResources: %w", err)
	}
	al, err := h.dm.ListAllocations(lctx, &dmv1.ListAllocationsRequest{})
	if err != nil {
		return s, fmt.Errorf("ListAllocations: %w", err)
	}
	for _, p := range pl.GetPlugins() {
		if p.GetType() != "DevicePlugin" {
			continue
		}
		s.Plugins = append(s.Plugins, ListedPlugin{Socket: p.GetSocketPath(), Registered: p.GetState() == rcv1.PluginState_PLUGIN_STATE_REGISTERED,
			State: p.GetState().String(), LastError: p.GetLastError()})
	}
	for _, r := range rs.GetResources() {
		lr := ListedResource{Name: r.GetName(), Allocatable: r.GetAllocatable()}
		for _, e := range r.GetEndpoints() {
			lr.Sockets = append(lr.Sockets, e.GetSocketPath())
		}
		s.Resources = append(s.Resources, lr)
	}
	for _, a := range al.GetAllocations() {
		s.Allocations = append(s.Allocations, Listed{Key: AllocKey{Pod: a.GetPodUid(), Container: a.GetContainerName(), Resource: a.GetResourceName()}, Devices: a.GetDeviceIds()})
	}
	h.mu.Lock()
	for _, p := range h.plugins {
		s.Live = append(s.Live, LivePlugin{Resource: p.resource, Socket: p.socket, Devices: int64(h.cfg.Devices), Registry: p.registry})
	}
	s.Acked = make(map[AllocKey][]string, len(h.acked))
	for k, v := range h.acked {
		s.Acked[k] = v
	}
	s.Released = make(map[string]bool, len(h.released))
	for k := range h.released {
		s.Released[k] = true
	}
	h.mu.Unlock()
	s.CheckPlugins = true
	s.CheckSpecs, s.Specs = true, h.specs()
	return s, nil
}

// converge pauses the load, waits until the services match the live
// plugins, and checks every invariant. After a restart of svc (not empty)
// it records how long the convergence took.
func (h *harness) converge(ctx context.Context, when, svc string) (time.Duration, error) {
	h.pause.Lock()
	defer h.pause.Unlock()
	t0 := time.Now()
	deadline := t0.Add(h.cfg.Converge)
	var first, last string
	for {
		h.register(ctx)
		s, err := h.snapshot(ctx)
		if err == nil {
			m := Mismatch(s.Plugins, s.Resources, s.Live)
			if m == "" {
				d := time.Since(t0)
				if d > SlowConverge {
					h.logf("  slow convergence after %s: %v; first: %s; last: %s", when, d.Round(time.Millisecond), first, last)
				}
				h.mu.Lock()
				if svc != "" {
					h.convergeT = append(h.convergeT, d)
					h.convergeBy[svc] = append(h.convergeBy[svc], d)
					if d > SlowConverge {
						h.res.Slow = append(h.res.Slow, SlowConvergence{When: when, Service: svc, Ms: float64(d.Microseconds()) / 1000, WaitingFor: last, FirstSeen: first})
					}
				}
				h.res.Checks++
				h.mu.Unlock()
				h.violate(Check(when, s)...)
				return d, nil
			}
			last = m
		} else {
			last = err.Error()
		}
		if first == "" {
			first = last
		}
		if time.Now().After(deadline) {
			h.violate(Violation{Invariant: "c", When: when, Detail: "did not converge: " + last})
			return 0, fmt.Errorf("%s: %w within %v: %s", when, errConverge, h.cfg.Converge, last)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// specs returns the CDI device names of the container specs in the
// devicemanager's spec directory (<root>/cdi, as internal/stack sets it),
// from their file names (nodeplug.io-container_<name>.json).
func (h *harness) specs() map[string]bool {
	out := map[string]bool{}
	entries, _ := os.ReadDir(filepath.Join(h.root, "cdi"))
	for _, e := range entries {
		if n, ok := strings.CutPrefix(e.Name(), "nodeplug.io-container_"); ok && strings.HasSuffix(n, ".json") {
			out[strings.TrimSuffix(n, ".json")] = true
		}
	}
	return out
}
