package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
)

// allocWatch follows WatchResources and records, per resource, the lowest
// allocatable seen after the snapshot. It resubscribes when the stream ends
// (the devicemanager restarting) and records the gaps.
type allocWatch struct {
	mu       sync.Mutex
	min      map[string]int64
	last     map[string]int64
	streams  int // streams opened
	cancel   context.CancelFunc
	finished chan struct{}
}

func watchAllocatable(e *env) *allocWatch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &allocWatch{min: map[string]int64{}, last: map[string]int64{}, cancel: cancel, finished: make(chan struct{})}
	synced := make(chan struct{})
	var once sync.Once
	go func() {
		defer close(w.finished)
		for ctx.Err() == nil {
			stream, err := e.dm.WatchResources(ctx, &dmv1.WatchResourcesRequest{})
			if err != nil {
				pause(ctx)
				continue
			}
			w.mu.Lock()
			w.streams++
			w.mu.Unlock()
			live := false
			for {
				resp, err := stream.Recv()
				if err != nil {
					break
				}
				if resp.GetSynced() != nil {
					live = true
					once.Do(func() { close(synced) })
					continue
				}
				ch := resp.GetChange()
				name := ch.GetResource().GetName()
				v := ch.GetResource().GetAllocatable()
				if ch.GetType() == dmv1.ResourceChangeType_RESOURCE_CHANGE_TYPE_REMOVED {
					v = 0
				}
				w.mu.Lock()
				w.last[name] = v
				if live && name != "" {
					if m, ok := w.min[name]; !ok || v < m {
						w.min[name] = v
					}
				}
				w.mu.Unlock()
			}
			pause(ctx)
		}
	}()
	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		e.t.Fatal("WatchResources never synced")
	}
	return w
}

// pause waits a little before the watch resubscribes, or until ctx ends.
func pause(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(50 * time.Millisecond):
	}
}

func (w *allocWatch) stop() (minimum map[string]int64, streams int) {
	w.cancel()
	<-w.finished
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.min, w.streams
}

// TestRestartsKeepState kills each service in turn with SIGKILL while a
// plugin of each registration path is registered and an allocation exists,
// starts it again, and checks that allocatable never dipped (apiserver,
// watcher, reconciler) or came back without any plugin re-creating its
// socket (devicemanager), that the allocation is intact, that no endpoint
// is duplicated, and that a watcher or reconciler restart does not
// register the plugins_registry plugin again.
func TestRestartsKeepState(t *testing.T) {
	for _, svc := range stack.Services {
		t.Run(svc, func(t *testing.T) {
			e := newEnv(t)
			viaRegistry := e.plugin("registry", "example.com/registry", 4, false)
			legacy := e.plugin("legacy", "example.com/legacy", 2, true)
			e.waitAllocatable("example.com/registry", 4)
			e.waitAllocatable("example.com/legacy", 2)
			testutil.Eventually(t, "reconciler shows the plugin registered", func() error {
				if p := e.pluginBySocket(viaRegistry.SocketPath()); p.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED {
					return fmt.Errorf("state %v", p.GetState())
				}
				return nil
			})

			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			alloc, err := e.dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: "pod-1", ContainerName: "main", Resources: []*dmv1.ResourceRequest{
				{ResourceName: "example.com/registry", Count: 2},
				{ResourceName: "example.com/legacy", Count: 1},
			}})
			if err != nil {
				t.Fatal(err)
			}
			before, err := e.dm.ListAllocations(ctx, &dmv1.ListAllocationsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			registryNotifies := len(viaRegistry.Statuses())
			if svc == "reconciler" {
				// Its registration is on disk (written in the background
				// within a tenth of a second) before the kill.
				file := layout.RegistrationsFile(e.root)
				testutil.Eventually(t, "the registry plugin in the reconciler's registrations file", func() error {
					b, err := os.ReadFile(file)
					if err != nil || !strings.Contains(string(b), viaRegistry.SocketPath()) {
						return fmt.Errorf("%s: %v %s", file, err, b)
					}
					return nil
				})
			}

			w := watchAllocatable(e)
			e.st.Kill(svc)
			if err := e.st.Start(ctx, svc); err != nil {
				t.Fatal(err)
			}

			// Converged: the reconciler (new or old) has the plugin
			// registered, both resources are live with their endpoints.
			testutil.Eventually(t, "convergence after the restart", func() error {
				if p := e.pluginBySocket(viaRegistry.SocketPath()); p.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED {
					return fmt.Errorf("registry plugin state %v", p.GetState())
				}
				for name, n := range map[string]int64{"example.com/registry": 4, "example.com/legacy": 2} {
					r := e.resource(name)
					if r == nil {
						return fmt.Errorf("%s absent", name)
					}
					if r.GetAllocatable() != n {
						return fmt.Errorf("%s allocatable %d, want %d", name, r.GetAllocatable(), n)
					}
					if len(r.GetEndpoints()) != 1 {
						return fmt.Errorf("%s has %d endpoints, want 1: %v", name, len(r.GetEndpoints()), r.GetEndpoints())
					}
					if st := r.GetEndpoints()[0].GetState(); st != dmv1.EndpointState_ENDPOINT_STATE_LIVE {
						return fmt.Errorf("%s endpoint state %v", name, st)
					}
				}
				return nil
			})
			if svc == "watcher" {
				// The reconciler must have resubscribed to the new watcher:
				// a socket created now still registers.
				extra := e.plugin("extra", "example.com/extra", 1, false)
				e.waitAllocatable("example.com/extra", 1)
				extra.Stop()
			}
			if svc == "devicemanager" {
				// The watch breaks with the old process; resubscribed, its
				// snapshot shows both resources back at full allocatable.
				testutil.Eventually(t, "WatchResources resubscribed with the resources back", func() error {
					w.mu.Lock()
					defer w.mu.Unlock()
					if w.streams < 2 {
						return fmt.Errorf("%d streams", w.streams)
					}
					if w.last["example.com/registry"] != 4 || w.last["example.com/legacy"] != 2 {
						return fmt.Errorf("allocatable seen %v", w.last)
					}
					return nil
				})
			}
			minimum, _ := w.stop()
			if svc != "devicemanager" {
				// Resources with no change after the snapshot never dipped.
				if m, ok := minimum["example.com/registry"]; ok && m < 4 {
					t.Errorf("example.com/registry allocatable dipped to %d while the %s restarted", m, svc)
				}
				if m, ok := minimum["example.com/legacy"]; ok && m < 2 {
					t.Errorf("example.com/legacy allocatable dipped to %d while the %s restarted", m, svc)
				}
			}

			after, err := e.dm.ListAllocations(ctx, &dmv1.ListAllocationsRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if len(after.GetAllocations()) != len(before.GetAllocations()) {
				t.Fatalf("allocations before %v, after %v", before.GetAllocations(), after.GetAllocations())
			}
			for i := range before.GetAllocations() {
				if !proto.Equal(before.GetAllocations()[i], after.GetAllocations()[i]) {
					t.Errorf("allocation changed across the restart:\nbefore %v\nafter  %v", before.GetAllocations()[i], after.GetAllocations()[i])
				}
			}
			// The same request again gets the saved answer.
			again, err := e.dm.Allocate(ctx, &dmv1.AllocateRequest{PodUid: "pod-1", ContainerName: "main", Resources: []*dmv1.ResourceRequest{
				{ResourceName: "example.com/registry", Count: 2},
				{ResourceName: "example.com/legacy", Count: 1},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if !sameDevices(alloc, again) {
				t.Errorf("Allocate after the restart gave %v, before %v", again, alloc)
			}
			if svc == "devicemanager" {
				// Plugins were not asked to re-create anything: the legacy
				// plugin registered once, and its stream was redialled.
				if got := legacy.StreamCount(); got != 1 {
					t.Errorf("legacy plugin has %d ListAndWatch streams, want 1", got)
				}
			}
			// Neither a watcher restart nor a reconciler restart (which
			// adopts its registrations from its file) contacts the plugin.
			if got := len(viaRegistry.Statuses()); (svc == "watcher" || svc == "reconciler") && got != registryNotifies {
				t.Errorf("a %s restart re-registered the plugin (%d → %d notifications)", svc, registryNotifies, got)
			}
		})
	}
}

func sameDevices(a, b *dmv1.AllocateResponse) bool {
	ids := func(r *dmv1.AllocateResponse) map[string][]string {
		m := map[string][]string{}
		for _, al := range r.GetAllocations() {
			m[al.GetResourceName()] = al.GetDeviceIds()
		}
		return m
	}
	ia, ib := ids(a), ids(b)
	if len(ia) != len(ib) {
		return false
	}
	for k, v := range ia {
		w := ib[k]
		if len(v) != len(w) {
			return false
		}
		for i := range v {
			if v[i] != w[i] {
				return false
			}
		}
	}
	return true
}
