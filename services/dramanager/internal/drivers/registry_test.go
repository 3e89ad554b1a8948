package drivers_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/connectivity"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
)

func newRegistry(t *testing.T, api *dratest.API, delay time.Duration) (*drivers.Registry, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	r, err := drivers.New(drivers.Config{Client: api.Client, NodeName: dratest.Node, AllowedDirs: []string{api.Root}, DisconnectDelay: delay, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, reg
}

func register(t *testing.T, r *drivers.Registry, d *dratest.Driver) drivers.Instance {
	t.Helper()
	in, err := r.Register(context.Background(), drivers.Registration{
		Driver: d.Name, Endpoint: d.Endpoint, Services: d.Services, SocketPath: d.RegSocket, Generation: d.Generation(t),
	})
	if err != nil {
		t.Fatalf("register %s at %s: %v", d.Name, d.Endpoint, err)
	}
	return in
}

func instance(r *drivers.Registry, driver, endpoint string) (drivers.Instance, bool) {
	for _, d := range r.Drivers(driver) {
		for _, in := range d.Instances {
			if in.Endpoint == endpoint {
				return in, true
			}
		}
	}
	return drivers.Instance{}, false
}

func waitConnected(t *testing.T, r *drivers.Registry, d *dratest.Driver, want bool) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("%s at %s connected=%v", d.Name, d.Endpoint, want), func() error {
		in, ok := instance(r, d.Name, d.Endpoint)
		if !ok {
			return errors.New("not registered")
		}
		if in.Connected != want {
			return fmt.Errorf("connected=%v (state %s, last error %q)", in.Connected, in.State, in.LastError)
		}
		return nil
	})
}

func deletions(t *testing.T, reg *prometheus.Registry, driver, reason string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := testutil.MetricValue(testutil.FindMetric(fams, "nodeplug_dra_resource_slice_deletions_total", map[string]string{"driver": driver, "reason": reason}))
	return v
}

func gauge(t *testing.T, reg *prometheus.Registry, driver, state string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v, _ := testutil.MetricValue(testutil.FindMetric(fams, "nodeplug_dra_driver_instances", map[string]string{"driver": driver, "state": state}))
	return v
}

// Two instances of one driver (the helper's rolling-update mode): the
// newest connected one serves; when it stops the older one serves, and as
// one stays connected nothing is due for deletion.
func TestNewestConnectedInstanceServes(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	r, metrics := newRegistry(t, api, time.Hour)
	old := dratest.StartDriver(t, api, "gpu.example.com", "uid-1")
	in := register(t, r, old)
	if in.Service != "v1.DRAPlugin" {
		t.Errorf("service = %q, want v1.DRAPlugin (offered %q)", in.Service, old.Services)
	}
	if in.HealthService != "v1.DRAResourceHealth" {
		t.Errorf("health service = %q, want v1.DRAResourceHealth (offered %q)", in.HealthService, old.Services)
	}
	waitConnected(t, r, old, true)
	newer := dratest.StartDriver(t, api, "gpu.example.com", "uid-2")
	if newer.Endpoint == old.Endpoint {
		t.Fatalf("both instances serve %s", old.Endpoint)
	}
	register(t, r, newer)
	waitConnected(t, r, newer, true)
	if c, err := r.Serving("gpu.example.com"); err != nil || c.Endpoint != newer.Endpoint {
		t.Fatalf("serving = %q, %v; want the newer instance %s", c.Endpoint, err, newer.Endpoint)
	}
	if in, _ := instance(r, old.Name, old.Endpoint); in.Serving {
		t.Error("the older instance says it serves while the newer one is connected")
	}

	newer.Helper.Stop()
	waitConnected(t, r, newer, false)
	if c, err := r.Serving("gpu.example.com"); err != nil || c.Endpoint != old.Endpoint {
		t.Fatalf("serving after the newer instance stopped = %q, %v; want %s", c.Endpoint, err, old.Endpoint)
	}
	if d := r.Drivers("gpu.example.com"); len(d) != 1 || !d[0].SliceDeletion.IsZero() || len(d[0].Instances) != 2 {
		t.Fatalf("drivers = %+v; want two instances and no deletion pending while one is connected", d)
	}
	if in, _ := instance(r, old.Name, old.Endpoint); !in.Serving {
		t.Error("the connected older instance does not say it serves")
	}
	for state, want := range map[string]float64{"connected": 1, "disconnected": 1} {
		if got := gauge(t, metrics, "gpu.example.com", state); got != want {
			t.Errorf("nodeplug_dra_driver_instances{state=%q} = %v, want %v", state, got, want)
		}
	}
	if _, err := r.Serving("other.example.com"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Serving of an unknown driver: %v, want ErrNotFound", err)
	}
}

// When the only instance stops, the driver's slices on the node are
// deleted once the delay has passed, and counted.
func TestDisconnectDeletesSlicesAfterDelay(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	r, metrics := newRegistry(t, api, 2*time.Second)
	d := dratest.StartDriver(t, api, "gpu.example.com", "")
	other := dratest.StartDriver(t, api, "nic.example.com", "")
	register(t, r, d)
	register(t, r, other)
	waitConnected(t, r, d, true)
	waitConnected(t, r, other, true)
	d.Publish(t, 3)
	other.Publish(t, 1)
	dratest.WaitSlices(t, api.Client, d.Name, 1, 3)
	dratest.WaitSlices(t, api.Client, other.Name, 1, 1)

	d.Helper.Stop()
	waitConnected(t, r, d, false)
	dratest.WaitSlices(t, api.Client, d.Name, 0, 0)
	testutil.WaitFor(t, "the deletion counted", func() bool { return deletions(t, metrics, d.Name, "disconnected") == 1 })
	// The other driver, still connected, keeps its slices.
	dratest.WaitSlices(t, api.Client, other.Name, 1, 1)
	if n := deletions(t, metrics, other.Name, "disconnected"); n != 0 {
		t.Errorf("deletions of the connected driver = %v", n)
	}
}

// A driver that comes back (a new instance, registered with its new
// generation) within the delay keeps its slices: the pending deletion is
// dropped and, once its time has passed, nothing was deleted.
func TestReconnectWithinDelayKeepsSlices(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	const delay = 5 * time.Second
	r, metrics := newRegistry(t, api, delay)
	d := dratest.StartDriver(t, api, "gpu.example.com", "")
	register(t, r, d)
	waitConnected(t, r, d, true)
	d.Publish(t, 2)
	dratest.WaitSlices(t, api.Client, d.Name, 1, 2)

	oldGen := d.Generation(t)
	d.Helper.Stop()
	waitConnected(t, r, d, false)
	var due time.Time
	testutil.Eventually(t, "a deletion pending", func() error {
		if dd := r.Drivers(d.Name); len(dd) == 1 && !dd[0].SliceDeletion.IsZero() {
			due = dd[0].SliceDeletion
			return nil
		}
		return errors.New("none pending")
	})
	again := dratest.StartDriver(t, api, "gpu.example.com", "")
	in := register(t, r, again)
	if in.Generation == oldGen {
		t.Fatalf("the restarted driver's registration socket kept generation %q", oldGen)
	}
	waitConnected(t, r, again, true)
	if dd := r.Drivers(d.Name); len(dd) != 1 || !dd[0].SliceDeletion.IsZero() || len(dd[0].Instances) != 1 {
		t.Fatalf("drivers after the new instance connected = %+v; want one instance (the new generation replaced the old) and nothing pending", dd)
	}
	// Had the deletion not been dropped, it would have run at due.
	testutil.WaitFor(t, "the old deadline to pass", func() bool { return time.Now().After(due.Add(time.Second)) })
	dratest.WaitSlices(t, api.Client, d.Name, 1, 2)
	if n := deletions(t, metrics, d.Name, "disconnected"); n != 0 {
		t.Errorf("deletions = %v, want 0", n)
	}
}

// After a start, the slices of a driver that does not register within the
// delay are deleted; those of a driver that registers again are kept.
func TestStartDeletesSlicesOfDriversThatDoNotComeBack(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	gone := dratest.StartDriver(t, api, "gone.example.com", "")
	back := dratest.StartDriver(t, api, "back.example.com", "")
	gone.Publish(t, 1)
	back.Publish(t, 2)
	dratest.WaitSlices(t, api.Client, gone.Name, 1, 1)
	dratest.WaitSlices(t, api.Client, back.Name, 1, 2)
	gone.Helper.Stop()

	r, metrics := newRegistry(t, api, 3*time.Second)
	r.Start()
	register(t, r, back)
	waitConnected(t, r, back, true)
	dratest.WaitSlices(t, api.Client, gone.Name, 0, 0)
	testutil.WaitFor(t, "the deletion counted", func() bool { return deletions(t, metrics, gone.Name, "absent") == 1 })
	dratest.WaitSlices(t, api.Client, back.Name, 1, 2)
	if n := deletions(t, metrics, back.Name, "absent"); n != 0 {
		t.Errorf("deletions of the driver that came back = %v", n)
	}
}

// The reconciler registers again after its own restart: the same
// generation is a no-op that keeps the connection.
func TestRegisterSameGenerationIsNoop(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	r, _ := newRegistry(t, api, time.Hour)
	d := dratest.StartDriver(t, api, "gpu.example.com", "")
	first := register(t, r, d)
	waitConnected(t, r, d, true)
	again := register(t, r, d)
	if !again.Registered.Equal(first.Registered) || !again.Connected || again.State != connectivity.Ready {
		t.Fatalf("second registration = %+v, want the first instance (%v), still connected", again, first.Registered)
	}
	removed, err := r.Deregister(context.Background(), d.Name, d.Endpoint, "another generation")
	if err != nil || removed {
		t.Fatalf("deregister with another generation: %v, %v; want nothing removed", removed, err)
	}
	removed, err = r.Deregister(context.Background(), d.Name, d.Endpoint, first.Generation)
	if err != nil || !removed {
		t.Fatalf("deregister: %v, %v", removed, err)
	}
	if dd := r.Drivers(d.Name); len(dd) != 1 || len(dd[0].Instances) != 0 || dd[0].SliceDeletion.IsZero() {
		t.Fatalf("drivers after deregistering the only instance = %+v; want a deletion pending", dd)
	}
}

// Registrations of one endpoint and generation that race (each builds its
// connection outside the registry's lock) end with one instance, which
// every caller is given; the same generation for another driver is then
// refused.
func TestConcurrentRegistrationsOfOneGeneration(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	r, _ := newRegistry(t, api, time.Hour)
	d := dratest.StartDriver(t, api, "gpu.example.com", "")
	reg := drivers.Registration{Driver: d.Name, Endpoint: d.Endpoint, Services: d.Services, SocketPath: d.RegSocket, Generation: d.Generation(t)}
	const n = 8
	got := make([]drivers.Instance, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = r.Register(context.Background(), reg) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("registration %d: %v", i, errs[i])
		}
		if !got[i].Registered.Equal(got[0].Registered) {
			t.Fatalf("registration %d is of an instance registered at %v, registration 0 of one at %v: want one instance", i, got[i].Registered, got[0].Registered)
		}
	}
	if dd := r.Drivers(d.Name); len(dd) != 1 || len(dd[0].Instances) != 1 {
		t.Fatalf("drivers = %+v, want one instance of %s", dd, d.Name)
	}
	other := reg
	other.Driver = "other.example.com"
	if _, err := r.Register(context.Background(), other); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("the same generation for another driver: %v, want ErrAlreadyExists", err)
	}
	waitConnected(t, r, d, true)
}

func TestRegisterRefusesBadInput(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	r, _ := newRegistry(t, api, time.Hour)
	d := dratest.StartDriver(t, api, "gpu.example.com", "")
	good := drivers.Registration{Driver: d.Name, Endpoint: d.Endpoint, Services: d.Services, SocketPath: d.RegSocket, Generation: d.Generation(t)}
	for name, tc := range map[string]struct {
		mod  func(*drivers.Registration)
		want error
	}{
		"no name":             {func(g *drivers.Registration) { g.Driver = "" }, errdefs.ErrInvalidArgument},
		"no generation":       {func(g *drivers.Registration) { g.Generation = "" }, errdefs.ErrInvalidArgument},
		"unsupported service": {func(g *drivers.Registration) { g.Services = []string{"v1alpha4.Node"} }, errdefs.ErrInvalidArgument},
		"outside the dirs":    {func(g *drivers.Registration) { g.Endpoint = "/tmp/../etc/dra.sock" }, errdefs.ErrInvalidArgument},
		"no socket there":     {func(g *drivers.Registration) { g.Endpoint = filepath.Join(api.Root, "plugins", "none.sock") }, errdefs.ErrInvalidArgument},
	} {
		g := good
		tc.mod(&g)
		if _, err := r.Register(context.Background(), g); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if dd := r.Drivers(""); len(dd) != 0 {
		t.Fatalf("refused registrations left %+v", dd)
	}
	register(t, r, d)
	g := good
	g.Driver = "other.example.com"
	if _, err := r.Register(context.Background(), g); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("the same endpoint and generation for another driver: %v, want ErrAlreadyExists", err)
	}
}
