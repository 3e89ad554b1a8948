package upstream

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/stack"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
)

// staleSockets is how many socket files that refuse connections lie in
// plugins_registry beside the healthy plugin.
const staleSockets = 1000

// TestHealthyPluginRegistersBesideStaleSockets: with 1,000 socket files in
// plugins_registry that refuse connections (closed listeners left on disk
// by plugins killed without cleanup, and sockets bound but never listened
// on), a healthy plugin does not queue behind them. In the order the
// reconciler publishes its changes: every stale socket is known; the
// healthy plugin appears and becomes REGISTERED while every stale socket is
// still listed as pending or failed, none registered; and only after that
// is some stale socket retried again (another failed attempt, with a
// backoff), so they were still being retried when the healthy one
// registered. No step is timed.
//
// The healthy plugin is the upstream devicemanager Stub serving the
// Registration service on plugins_registry. The pluginwatcher example
// plugin cannot be the healthy one: NewTestExamplePlugin's
// NotifyRegistrationStatus sends on an unbuffered, unexported channel that
// nothing in v1.37.2 lets a caller drain, so every registration of it
// fails at the notification, and NewExamplePlugin leaves name, type and
// endpoint empty with no way to set them. TestExamplePluginNotifyFailure
// (exampleplugin_test.go) uses it for exactly that failure.
func TestHealthyPluginRegistersBesideStaleSockets(t *testing.T) {
	root, ctx, conn := startStack(t, 3*time.Minute, "reconciler")
	w := watchPlugins(ctx, t, rcv1.NewReconcilerServiceClient(conn))

	registry := filepath.Join(root, "plugins_registry")
	stale := make(map[string]bool, staleSockets)
	for i := range staleSockets {
		path := filepath.Join(registry, fmt.Sprintf("stale-%04d.sock", i))
		if err := stack.StaleSocket(path, i%2 == 0); err != nil {
			t.Fatalf("stale socket %s: %v", path, err)
		}
		stale[path] = true
	}
	// 1. Every stale socket is known to the reconciler before the healthy
	// plugin's socket exists.
	w.until(t, "all stale sockets listed", func() bool {
		for path := range stale {
			if w.state[path] == nil {
				return false
			}
		}
		return true
	})

	// 2. The healthy plugin appears and registers.
	const res = "example.com/beside-stale"
	sock := filepath.Join(registry, "healthy.sock")
	s := plugin.NewDevicePluginStub(logger(), devices("h-1"), sock, res, false, false)
	s.SetAllocFunc(echoAlloc)
	if err := s.Start(klog.NewContext(context.Background(), logger())); err != nil {
		t.Fatalf("Stub Start: %v", err)
	}
	t.Cleanup(func() { _ = s.Stop(logger()) })
	w.until(t, "the healthy plugin REGISTERED", func() bool {
		return w.state[sock].GetState() == rcv1.PluginState_PLUGIN_STATE_REGISTERED
	})

	// 3. At that point in the reconciler's history, every stale socket is
	// still there, pending or failed, none registered.
	failures := make(map[string]uint32, len(stale))
	var pending, failed int
	for path := range stale {
		p := w.state[path]
		switch p.GetState() {
		case rcv1.PluginState_PLUGIN_STATE_PENDING:
			pending++
		case rcv1.PluginState_PLUGIN_STATE_FAILED:
			failed++
		default:
			t.Fatalf("when the healthy plugin registered, stale socket %s was %v", path, p)
		}
		failures[path] = p.GetFailures()
	}
	t.Logf("when the healthy plugin registered: %d stale sockets pending, %d failed", pending, failed)

	// 4. Afterwards a stale socket records a further failed attempt, with a
	// backoff before its next one: they were still being retried.
	var again *rcv1.Plugin
	w.until(t, "a stale socket retried after the healthy plugin registered", func() bool {
		for path := range stale {
			if p := w.state[path]; p.GetState() == rcv1.PluginState_PLUGIN_STATE_FAILED && p.GetFailures() > failures[path] {
				again = p
				return true
			}
		}
		return false
	})
	if again.GetNextRetryTime() == nil || again.GetLastError() == "" {
		t.Errorf("a failed stale socket without a backoff or an error: %v", again)
	}
	if h := w.state[sock]; h.GetState() != rcv1.PluginState_PLUGIN_STATE_REGISTERED {
		t.Errorf("the healthy plugin is no longer registered: %v", h)
	}
}

// pluginWatch follows the reconciler's WatchPlugins. A goroutine reads the
// stream as fast as it comes, so the subscriber does not fall behind while
// the test works; the test applies the changes in order, so that state is
// the reconciler's at the last change applied. Should the reconciler still
// drop the subscriber (RESOURCE_EXHAUSTED), it resubscribes and state is
// rebuilt from the new snapshot before any condition is checked again.
type pluginWatch struct {
	mu     sync.Mutex
	queue  []watchItem
	wake   chan struct{}
	state  map[string]*rcv1.Plugin
	resync bool // between a resubscription and its synced marker
}

// watchItem is one response, a resubscription (reset) or the stream's end.
type watchItem struct {
	resp  *rcv1.WatchPluginsResponse
	reset bool
	err   error
}

func watchPlugins(ctx context.Context, t *testing.T, c rcv1.ReconcilerServiceClient) *pluginWatch {
	t.Helper()
	w := &pluginWatch{wake: make(chan struct{}, 1), state: map[string]*rcv1.Plugin{}, resync: true}
	push := func(it watchItem) {
		w.mu.Lock()
		w.queue = append(w.queue, it)
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	go func() {
		for first := true; ; first = false {
			s, err := c.WatchPlugins(ctx, &rcv1.WatchPluginsRequest{})
			if err != nil {
				push(watchItem{err: err})
				return
			}
			if !first {
				push(watchItem{reset: true})
			}
			for {
				r, err := s.Recv()
				if status.Code(err) == codes.ResourceExhausted {
					break
				}
				if err != nil {
					push(watchItem{err: err})
					return
				}
				push(watchItem{resp: r})
			}
		}
	}()
	w.until(t, "WatchPlugins synced", func() bool { return true })
	return w
}

// until applies changes in order until done holds (checked after each
// change, never in the middle of a snapshot). The stream's context bounds
// the wait.
func (w *pluginWatch) until(t *testing.T, what string, done func() bool) {
	t.Helper()
	for {
		w.mu.Lock()
		items := w.queue
		w.queue = nil
		w.mu.Unlock()
		if len(items) == 0 {
			<-w.wake
			continue
		}
		for i, it := range items {
			switch {
			case it.err != nil:
				t.Fatalf("waiting for %s: WatchPlugins: %v", what, it.err)
			case it.reset:
				t.Logf("WatchPlugins resubscribed")
				clear(w.state)
				w.resync = true
				continue
			case it.resp.GetSynced() != nil:
				w.resync = false
			default:
				ch := it.resp.GetChange()
				if p := ch.GetPlugin(); ch.GetType() == rcv1.PluginChangeType_PLUGIN_CHANGE_TYPE_REMOVED {
					delete(w.state, p.GetSocketPath())
				} else if p != nil {
					w.state[p.GetSocketPath()] = p
				}
			}
			if !w.resync && done() {
				w.mu.Lock()
				w.queue = append(items[i+1:len(items):len(items)], w.queue...)
				w.mu.Unlock()
				return
			}
		}
	}
}
