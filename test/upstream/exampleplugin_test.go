package upstream

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager/pluginwatcher"

	"github.com/nodeplug/nodeplug/internal/testutil"
	rcv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
)

// TestExamplePluginNotifyFailure runs the pluginwatcher example plugin
// (NewTestExamplePlugin) as a DRA driver against the real stack. Its
// NotifyRegistrationStatus sends the status on an unbuffered, unexported
// channel that nothing drains, so every NotifyRegistrationStatus(true)
// blocks until the registrar's notify budget (the kubelet's 5 s) runs out.
// That is the kubelet's step 8 (operationexecutor, GenerateRegisterPluginFunc;
// e2e "must recover and register after NotifyRegistrationStatus failure"):
// the plugin leaves the actual state, its handler deregisters it, and the
// attempt fails with "failed to send registration status" and is retried
// after a backoff. The test waits for each state as the reconciler
// publishes it, and asserts:
//
//  1. GetInfo is answered (the reconciler records the plugin's name, type,
//     endpoint and versions) and the handler registers the driver, so the
//     attempt reaches NotifyRegistrationStatus;
//  2. the attempt fails with the kubelet's "failed to send registration
//     status" wording and a retry time, and the plugin is never REGISTERED;
//  3. after a failed attempt the driver is not left registered: ListDrivers
//     does not list it while the plugin stands failed;
//  4. the registration is retried: a further attempt fails the same way.
//
// No step is timed; the context bounds the waits.
func TestExamplePluginNotifyFailure(t *testing.T) {
	root, ctx, conn := startStack(t, 3*time.Minute, "reconciler")
	rc := rcv1.NewReconcilerServiceClient(conn)
	w := watchPlugins(ctx, t, rc)

	const (
		driver  = "example.dra.nodeplug.io"
		service = "v1.DRAPlugin"
	)
	// The endpoint is the registration socket itself: Serve listens there.
	sock := filepath.Join(root, "plugins_registry", "example-plugin.sock")
	ex := pluginwatcher.NewTestExamplePlugin(driver, registerapi.DRAPlugin, sock, service)
	pctx := klog.NewContext(context.Background(), logger())
	if err := ex.Serve(pctx, "v1beta1"); err != nil {
		t.Fatalf("example plugin Serve: %v", err)
	}
	t.Cleanup(func() {
		if err := ex.Stop(pctx); err != nil {
			t.Errorf("example plugin Stop: %v", err)
		}
	})

	// The reconciler's text for the kubelet's step 8 (the kubelet's own:
	// "RegisterPlugin error -- failed to send registration status at
	// socket <p>, err: <e>"); nodeplug's API adds the plugin's name.
	wording := "failed to send registration status at socket " + sock

	// failure waits for a failed attempt numbered at least n. Every change
	// on the way is checked: the plugin never stands registered.
	failure := func(n uint32) *rcv1.Plugin {
		t.Helper()
		w.until(t, fmt.Sprintf("failed attempt %d of the example plugin", n), func() bool {
			p := w.state[sock]
			if p.GetState() == rcv1.PluginState_PLUGIN_STATE_REGISTERED {
				t.Fatalf("the example plugin is registered although NotifyRegistrationStatus cannot succeed: %v", p)
			}
			return p.GetState() == rcv1.PluginState_PLUGIN_STATE_FAILED && p.GetFailures() >= n
		})
		p := w.state[sock]
		if !strings.HasPrefix(p.GetLastError(), "RegisterPlugin error -- ") || !strings.Contains(p.GetLastError(), wording) {
			t.Fatalf("failed attempt %d: last error %q, want the kubelet's %q", p.GetFailures(), p.GetLastError(), wording)
		}
		if p.GetNextRetryTime() == nil {
			t.Fatalf("failed attempt %d without a retry time: %v", p.GetFailures(), p)
		}
		return p
	}

	// 1. GetInfo answered, validation passed and the DRA handler
	// registered the driver: the attempt is past step 7, waiting on
	// NotifyRegistrationStatus (the only step left).
	testutil.Eventually(t, "the DRA handler to register the example driver", func() error {
		d, err := draDriver(ctx, rc, sock)
		switch {
		case err != nil:
			return err
		case d == nil:
			return fmt.Errorf("%s not listed", driver)
		case d.GetName() != driver || d.GetEndpoint() != sock || !slices.Equal(d.GetSupportedVersions(), []string{service}):
			t.Fatalf("DRA driver listed as %v, want %s at %s serving %s", d, driver, sock, service)
		}
		return nil
	})

	// 2. The attempt fails at the notification, in the kubelet's words.
	first := failure(1)
	if first.GetName() != driver || first.GetType() != registerapi.DRAPlugin || first.GetEndpoint() != sock ||
		!slices.Equal(first.GetSupportedVersions(), []string{service}) {
		t.Fatalf("GetInfo's answer recorded as %v, want %s %s at %s serving %s", first, registerapi.DRAPlugin, driver, sock, service)
	}
	t.Logf("failed attempt %d: %s", first.GetFailures(), first.GetLastError())

	// 3. While the plugin stands failed, the driver is not registered. A
	// ListDrivers between two ListPlugins that show the same failed
	// attempt saw the state after that attempt's undoing and before the
	// next attempt began; when a retry started in between, the next
	// failure is waited for and the check made again.
	var checked *rcv1.Plugin
	for n := first.GetFailures(); checked == nil; {
		before := listedPlugin(ctx, t, rc, sock)
		if before.GetState() == rcv1.PluginState_PLUGIN_STATE_FAILED {
			d, err := draDriver(ctx, rc, sock)
			if err != nil {
				t.Fatal(err)
			}
			after := listedPlugin(ctx, t, rc, sock)
			if after.GetState() == rcv1.PluginState_PLUGIN_STATE_FAILED && after.GetFailures() == before.GetFailures() &&
				after.GetLastTransitionTime().AsTime().Equal(before.GetLastTransitionTime().AsTime()) {
				if d != nil {
					t.Fatalf("after failed attempt %d the driver is still registered: %v", after.GetFailures(), d)
				}
				checked = after
				continue
			}
		}
		n = max(n, before.GetFailures()) + 1
		failure(n)
	}
	t.Logf("after failed attempt %d the driver is not listed", checked.GetFailures())

	// 4. It is retried after its backoff and fails the same way again.
	again := failure(checked.GetFailures() + 1)
	t.Logf("failed attempt %d: %s", again.GetFailures(), again.GetLastError())
}

// listedPlugin returns the socket's entry in ListPlugins (nil when absent).
func listedPlugin(ctx context.Context, t *testing.T, rc rcv1.ReconcilerServiceClient, sock string) *rcv1.Plugin {
	t.Helper()
	resp, err := rc.ListPlugins(ctx, &rcv1.ListPluginsRequest{})
	if err != nil {
		t.Fatalf("ListPlugins: %v", err)
	}
	for _, p := range resp.GetPlugins() {
		if p.GetSocketPath() == sock {
			return p
		}
	}
	return nil
}

// draDriver returns the DRA driver ListDrivers lists for the socket (nil
// when none).
func draDriver(ctx context.Context, rc rcv1.ReconcilerServiceClient, sock string) (*rcv1.DRADriver, error) {
	resp, err := rc.ListDrivers(ctx, &rcv1.ListDriversRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListDrivers: %w", err)
	}
	for _, d := range resp.GetDraDrivers() {
		if d.GetSocketPath() == sock {
			return d, nil
		}
	}
	return nil, nil
}
