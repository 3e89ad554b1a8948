package manager

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
)

// TestBurstGivesBackOnceSettled drives the give-back's state with a
// made-up clock: a steady trickle of changes, each sooner than Quiet after
// the last, is never due; once they stop, the burst is due Quiet after the
// last one, once; fewer changes than MinChanges are never due; and a burst
// that settles within Interval of the last give-back waits for it.
func TestBurstGivesBackOnceSettled(t *testing.T) {
	cfg := GiveBack{MinChanges: 3, Quiet: time.Second, Interval: 10 * time.Second}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	b := newBurst(cfg)

	// Two changes are not a burst, however long nothing else happens.
	for i := range 2 {
		if b.changed(at(time.Duration(i)*time.Millisecond), 1) {
			t.Fatalf("change %d started a burst below MinChanges", i+1)
		}
	}
	if _, ok := b.due(); ok {
		t.Fatal("due with fewer changes than MinChanges")
	}
	if _, ok := b.take(at(time.Hour)); ok {
		t.Fatal("given back with fewer changes than MinChanges")
	}

	// The third change makes a burst; more keep coming, 900 ms apart: at
	// every change the burst is pending and not due.
	if !b.changed(at(2*time.Millisecond), 1) {
		t.Fatal("the change that reached MinChanges did not start a burst")
	}
	last := at(2 * time.Millisecond)
	for i := 1; i <= 20; i++ {
		now := last.Add(900 * time.Millisecond)
		if _, ok := b.take(now); ok {
			t.Fatalf("given back during the burst, at change %d", i)
		}
		if b.changed(now, 1) {
			t.Fatalf("change %d started a burst again", i)
		}
		last = now
	}
	due, ok := b.due()
	if !ok || !due.Equal(last.Add(time.Second)) {
		t.Fatalf("due = %v, %v; want Quiet after the last change, %v", due, ok, last.Add(time.Second))
	}
	if _, ok := b.take(due.Add(-time.Nanosecond)); ok {
		t.Fatal("given back before Quiet had passed")
	}
	n, ok := b.take(due)
	if !ok || n != 23 {
		t.Fatalf("take at due = %d, %v; want the 23 changes", n, ok)
	}
	if _, ok := b.take(due.Add(time.Hour)); ok {
		t.Fatal("the same burst given back twice")
	}
	if _, ok := b.due(); ok {
		t.Fatal("still pending after the give-back")
	}

	// A second burst settles 2 s after the first give-back: it waits for
	// Interval.
	first := due
	for i := range 3 {
		b.changed(first.Add(time.Second+time.Duration(i)*time.Millisecond), 1)
	}
	if due, _ := b.due(); !due.Equal(first.Add(10 * time.Second)) {
		t.Fatalf("second burst due at %v, want Interval after the first give-back, %v", due, first.Add(10*time.Second))
	}
	if _, ok := b.take(first.Add(5 * time.Second)); ok {
		t.Fatal("given back again within Interval")
	}
	if n, ok := b.take(first.Add(10 * time.Second)); !ok || n != 3 {
		t.Fatalf("second give-back = %d, %v", n, ok)
	}
}

// TestGiveBackAfterArrivalsAndDepartures: with Run going, a burst of
// registrations, once settled, makes the manager give memory back (counted
// in its metric), and so does the burst of their deregistrations; the
// manager works as before after it.
func TestGiveBackAfterArrivalsAndDepartures(t *testing.T) {
	const plugins = 4
	root := testutil.TempDir(t)
	reg := prometheus.NewRegistry()
	m := running(t, root, Config{Registerer: reg, GiveBack: GiveBack{MinChanges: plugins, Quiet: time.Millisecond, Interval: time.Millisecond}})
	givenBack := func(want float64) func() error {
		return func() error {
			mfs, err := reg.Gather()
			if err != nil {
				return err
			}
			got, _ := testutil.MetricValue(testutil.FindMetric(mfs, "nodeplug_devicemanager_memory_give_backs_total", nil))
			if got < want {
				return fmt.Errorf("%v give-backs, want %v", got, want)
			}
			return nil
		}
	}

	var ps []*sampleplugin.Plugin
	for i := range plugins {
		p := plugintest.Start(t, sampleplugin.Options{
			Resource: fmt.Sprintf("example.com/gb%d", i), Devices: 1,
			SocketPath: filepath.Join(root, "plugins_registry", fmt.Sprintf("p%d.sock", i)),
		})
		if err := m.Register(ctxT(t), Registration{Resource: p.Resource(), Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g", Path: PathPluginsRegistry}); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	testutil.Eventually(t, "memory given back after the arrivals", givenBack(1))

	for _, p := range ps {
		if ok, err := m.Deregister(ctxT(t), p.Resource(), p.SocketPath(), "g"); !ok || err != nil {
			t.Fatalf("deregister %s: %v, %v", p.Resource(), ok, err)
		}
	}
	testutil.Eventually(t, "memory given back after the departures", givenBack(2))

	// The maps rebuilt by the give-back still hold every resource.
	if rs := m.ListResources(); len(rs) != plugins {
		t.Fatalf("resources after the give-backs: %+v", rs)
	}
	if err := m.Register(ctxT(t), Registration{Resource: ps[0].Resource(), Endpoint: ps[0].SocketPath(), Versions: []string{"v1beta1"}, Generation: "g2", Path: PathPluginsRegistry}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, ps[0].Resource()+" allocatable again", func() error {
		for _, r := range m.ListResources() {
			if r.Name == ps[0].Resource() && r.Allocatable == 1 {
				return nil
			}
		}
		return fmt.Errorf("resources %+v", m.ListResources())
	})
}
