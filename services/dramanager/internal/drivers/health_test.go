package drivers_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
)

func waitHealth(t *testing.T, r *drivers.Registry, device, health, message string) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("health of %s = %s %q", device, health, message), func() error {
		h, m := r.Health(gpu, dratest.Node, device)
		if h != health || m != message {
			return fmt.Errorf("health %q, message %q", h, m)
		}
		return nil
	})
}

// The health a driver reports through the upstream helper's
// DRAResourceHealth service (v1, and v1alpha1 when only that is offered)
// is kept per device and follows every report; a stream the driver ends is
// opened again; a report past its timeout reads as Unknown.
func TestHealth(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []kubeletplugin.Option
		service string
	}{
		{"v1", nil, "v1.DRAResourceHealth"},
		{"v1alpha1", []kubeletplugin.Option{kubeletplugin.HealthV1(false)}, "v1alpha1.DRAResourceHealth"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := dratest.StartAPI(t, testutil.TempDir(t))
			r, _ := newRegistry(t, api, 0)
			p := dratest.NewPlugin(gpu)
			p.SetHealth(
				kubeletplugin.DeviceHealth{PoolName: dratest.Node, DeviceName: "dev-0", Health: kubeletplugin.HealthStatusHealthy},
				kubeletplugin.DeviceHealth{PoolName: dratest.Node, DeviceName: "dev-1", Health: kubeletplugin.HealthStatusUnhealthy, Message: "ECC errors"},
			)
			d := dratest.StartDriverWith(t, api, gpu, "", p, tc.opts...)
			if in := register(t, r, d); in.HealthService != tc.service {
				t.Fatalf("health service = %q, want %q (offered %q)", in.HealthService, tc.service, d.Services)
			}
			waitHealth(t, r, "dev-1", drivers.HealthUnhealthy, "ECC errors")
			waitHealth(t, r, "dev-0", drivers.HealthHealthy, "")
			if h, m := r.Health(gpu, dratest.Node, "dev-9"); h != "" || m != "" {
				t.Errorf("health of an unreported device = %q %q, want nothing", h, m)
			}
			if h, _ := r.Health("other.example.com", dratest.Node, "dev-0"); h != "" {
				t.Errorf("health of another driver's device = %q, want nothing", h)
			}

			p.SetHealth(kubeletplugin.DeviceHealth{PoolName: dratest.Node, DeviceName: "dev-1", Health: kubeletplugin.HealthStatusHealthy, Message: "recovered"})
			waitHealth(t, r, "dev-1", drivers.HealthHealthy, "recovered")
			// dev-0 was not in the last report: it keeps its health until
			// its timeout, as in the kubelet.
			if h, _ := r.Health(gpu, dratest.Node, "dev-0"); h != drivers.HealthHealthy {
				t.Errorf("health of dev-0 after a report without it = %q, want Healthy until it times out", h)
			}

			watches := p.HealthWatches()
			p.EndHealthStreams()
			testutil.Eventually(t, "the health stream opened again", func() error {
				if n := p.HealthWatches(); n <= watches {
					return fmt.Errorf("%d watches", n)
				}
				return nil
			})
			p.SetHealth(kubeletplugin.DeviceHealth{PoolName: dratest.Node, DeviceName: "dev-1", Health: kubeletplugin.HealthStatusUnhealthy,
				Message: "gone again", HealthCheckTimeout: time.Second})
			waitHealth(t, r, "dev-1", drivers.HealthUnhealthy, "gone again")
			// The driver sends nothing more: past its one-second timeout
			// the report no longer holds.
			waitHealth(t, r, "dev-1", drivers.HealthUnknown, "")
		})
	}
}

// A driver that offers the health service but reports nothing
// (Unimplemented) is not asked again, and its devices have no health.
func TestHealthNotSupported(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	var logs syncBuffer
	r, err := drivers.New(drivers.Config{Client: api.Client, NodeName: dratest.Node, AllowedDirs: []string{api.Root},
		Log: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	p := dratest.NewPlugin(gpu)
	d := dratest.StartDriverWith(t, api, gpu, "", p)
	register(t, r, d)
	waitConnected(t, r, d, true)
	// The watcher logs this as it gives up, and returns: no watch after.
	testutil.Eventually(t, "the health watcher gave up", func() error {
		if !strings.Contains(logs.String(), "DRA driver does not report device health") {
			return fmt.Errorf("not yet (%d watches)", p.HealthWatches())
		}
		return nil
	})
	if h, m := r.Health(gpu, dratest.Node, "dev-0"); h != "" || m != "" {
		t.Errorf("health = %q %q, want nothing", h, m)
	}
	if n := p.HealthWatches(); n != 1 {
		t.Errorf("WatchHealthStatus called %d times, want once", n)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger's writes and a test's
// reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
