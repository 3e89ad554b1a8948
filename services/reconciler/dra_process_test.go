package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	devicemanagerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/executor"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

// realDRAManager is a nodeplug-dramanager binary running on root, beside
// the nodeplug-apiserver that serves its node-local resource API.
type realDRAManager struct {
	t    *testing.T
	bin  string
	root string
	api  *stack.Process
	proc *stack.Process
	dra  devicemanagerv1.DRAServiceClient
}

// startDRAManager builds nodeplug-apiserver and nodeplug-dramanager and
// runs them on root (the resource API on a free loopback port) until the
// test ends; it returns once the dramanager serves gRPC.
func startDRAManager(t *testing.T, root string) *realDRAManager {
	t.Helper()
	bin := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := stack.Build(ctx, bin, "nodeplug-apiserver", "nodeplug-dramanager"); err != nil {
		t.Fatal(err)
	}
	d := &realDRAManager{t: t, bin: bin, root: root}
	t.Cleanup(func() {
		for _, p := range []*stack.Process{d.proc, d.api} {
			if p != nil {
				p.Kill()
			}
		}
	})
	d.api = d.run("nodeplug-apiserver")
	d.start()
	conn, err := rpcutil.DialPeer(layout.APISocket(root, "dramanager"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	d.dra = devicemanagerv1.NewDRAServiceClient(conn)
	return d
}

// run starts the binary name on the root dir and waits until it serves
// gRPC.
func (d *realDRAManager) run(name string) *stack.Process {
	d.t.Helper()
	p, err := stack.Start(filepath.Join(d.bin, name), []string{"--root-dir", d.root, "--metrics-listen", "", "--log-level", "debug"}, nil)
	if err != nil {
		d.t.Fatal(err)
	}
	if _, err := p.GRPCAddr(waitCtx(d.t)); err != nil {
		p.Kill()
		d.t.Fatalf("%s did not serve: %v\n%s", name, err, p.Logs())
	}
	return p
}

func (d *realDRAManager) start() {
	d.t.Helper()
	d.proc = d.run("nodeplug-dramanager")
}

// restart kills the dramanager (SIGKILL) and starts it again.
func (d *realDRAManager) restart() {
	d.t.Helper()
	d.proc.Kill()
	d.proc = nil
	d.start()
}

// instances returns the registered instances of driver by registration
// socket path, and the dramanager's instance ID.
func (d *realDRAManager) instances(driver string) (map[string]*devicemanagerv1.DRADriverInstance, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := d.dra.ListDRADrivers(ctx, &devicemanagerv1.ListDRADriversRequest{DriverName: driver})
	if err != nil {
		return nil, "", err
	}
	out := map[string]*devicemanagerv1.DRADriverInstance{}
	for _, drv := range resp.GetDrivers() {
		for _, in := range drv.GetInstances() {
			out[in.GetSocketPath()] = in
		}
	}
	return out, resp.GetInstanceId(), nil
}

// waitRegisteredRetrying waits until path is registered, moving the clock
// past each backoff: attempts made before the dramanager's connection
// came up fail and are retried.
func (e *env) waitRegisteredRetrying(path string) {
	e.t.Helper()
	testutil.Eventually(e.t, path+" registered", func() error {
		st, _ := e.status(path)
		if st.State == status.StateRegistered {
			return nil
		}
		if st.State == status.StateFailed && e.clk.Due(executor.Delay(st.Failures)) > 0 {
			e.clk.Advance(executor.Delay(st.Failures))
		}
		return fmt.Errorf("%v after %d failures: %s", st.State, st.Failures, st.LastError)
	})
}

// With the real dramanager, as a process of its own: two instances of
// one DRA driver (rolling update) register with it through the reconciler,
// with their sockets, generations and services; a kill -9 of the
// dramanager makes the reconciler register both again with the new
// process, without contacting the plugins; a socket removed deregisters
// its instance alone.
func TestDRAWithTheDRAManagerProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the dramanager binary")
	}
	e := newEnvWith(t, func(c *config) { c.DRAManagerAddr = layout.APISocket(c.AllowedDirs[0], "dramanager") })
	dm := startDRAManager(t, e.root)

	a := e.plugin("a", draPlugin("dra.example.com"))
	b := e.plugin("b", draPlugin("dra.example.com"))
	for _, p := range []*testplugin.Plugin{a, b} {
		e.w.Created(t, p.Path())
		e.waitRegisteredRetrying(p.Path())
	}
	check := func(what string) string {
		t.Helper()
		var id string
		testutil.Eventually(t, what, func() error {
			ins, instance, err := dm.instances("dra.example.com")
			if err != nil {
				return err
			}
			id = instance
			for _, p := range []*testplugin.Plugin{a, b} {
				in := ins[p.Path()]
				if in == nil {
					return fmt.Errorf("no instance for %s in %v", p.Path(), ins)
				}
				if in.GetEndpoint() != p.Path() || in.GetGeneration() != testutil.Generation(t, p.Path()) ||
					!slices.Equal(in.GetOfferedServices(), []string{"v1.DRAPlugin"}) || in.GetService() != "v1.DRAPlugin" {
					return fmt.Errorf("instance for %s: %v", p.Path(), in)
				}
			}
			if len(ins) != 2 {
				return fmt.Errorf("%d instances, want 2: %v", len(ins), ins)
			}
			return nil
		})
		return id
	}
	first := check("both instances registered with the dramanager")
	// Attempts made before the dramanager's connection came up were
	// refused and told so; from here on the plugins hear nothing more.
	told := map[string][2]int{}
	for _, p := range []*testplugin.Plugin{a, b} {
		told[p.Path()] = [2]int{len(p.Statuses()), p.GetInfoCalls()}
	}

	dm.restart()
	if again := check("both instances registered again with the restarted dramanager"); again == first {
		t.Fatalf("the dramanager kept its instance ID %s across a restart", first)
	}
	for _, p := range []*testplugin.Plugin{a, b} {
		if got := [2]int{len(p.Statuses()), p.GetInfoCalls()}; got != told[p.Path()] {
			t.Fatalf("%s: %d notifications and GetInfo calls after the dramanager restart, %d before; the plugin was contacted", p.Path(), got, told[p.Path()])
		}
		if last := p.Statuses()[len(p.Statuses())-1]; !last.Registered {
			t.Fatalf("%s: last notification %+v", p.Path(), last)
		}
	}

	a.Stop()
	e.w.Deleted(a.Path())
	e.waitGone(a.Path())
	testutil.Eventually(t, "the first instance deregistered alone", func() error {
		ins, _, err := dm.instances("dra.example.com")
		if err != nil {
			return err
		}
		if _, ok := ins[a.Path()]; ok || ins[b.Path()] == nil || len(ins) != 1 {
			return fmt.Errorf("instances %v, want only %s", ins, b.Path())
		}
		return nil
	})
}
