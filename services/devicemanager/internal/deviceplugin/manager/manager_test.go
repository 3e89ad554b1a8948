package manager

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testutil.Deadline)
	t.Cleanup(cancel)
	return ctx
}

// running opens a manager over root (its device-plugins directory, root
// the one allowed directory, a real store) with cfg's other fields, runs it
// until the test ends, and returns it.
func running(t *testing.T, root string, cfg Config) *Manager {
	t.Helper()
	dpDir := filepath.Join(root, "device-plugins")
	cfg.DevicePluginsDir, cfg.AllowedDirs, cfg.Store = dpDir, []string{root}, store.New(dpDir, store.Options{})
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m, err := Open(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-ran; err != nil {
			t.Error(err)
		}
	})
	return m
}

// registered returns a manager under a new root with one plugin of devices
// devices registered through plugins_registry and its first update in.
func registered(t *testing.T, resource string, devices int) (*Manager, *sampleplugin.Plugin, string) {
	t.Helper()
	root := testutil.TempDir(t)
	dpDir := filepath.Join(root, "device-plugins")
	m, err := Open(ctxT(t), Config{DevicePluginsDir: dpDir, AllowedDirs: []string{root}, Store: store.New(dpDir, store.Options{}), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	p := plugintest.Start(t, sampleplugin.Options{Resource: resource, Devices: devices, SocketPath: filepath.Join(root, "plugins_registry", "p.sock")})
	if err := m.Register(ctxT(t), Registration{Resource: resource, Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g", Path: PathPluginsRegistry}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, resource+" allocatable", func() error {
		if rs := m.ListResources(); len(rs) != 1 || rs[0].Allocatable != int64(devices) {
			return fmt.Errorf("resources %+v", rs)
		}
		return nil
	})
	return m, p, dpDir
}

// breakStore removes the store's directory, so that no checkpoint can be
// written until it is made again. A save in flight (a plugin's device
// list, say) may create a file in it while it is removed, after the
// listing: it is removed again until it is gone.
func breakStore(t *testing.T, dir string) {
	t.Helper()
	testutil.Eventually(t, dir+" removed", func() error {
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
		if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%s still there: %v", dir, err)
		}
		return nil
	})
}

// TestAllocationNotSavedIsRolledBack: an allocation that cannot be made
// durable is refused and leaves nothing allocated; its device stays taken
// until the taking back is durable too (the allocation may have reached
// the disk). Once the store works again, allocating works and is saved,
// and the device is free again.
func TestAllocationNotSavedIsRolledBack(t *testing.T) {
	const res = "example.com/unsaved"
	m, p, dpDir := registered(t, res, 2)
	breakStore(t, dpDir) // the checkpoint cannot be written
	req := &allocator.Request{PodUID: "pod", Container: "c", Resources: []allocator.ResourceRequest{{Name: res, Count: 1}}}
	_, err := m.Allocate(ctxT(t), req)
	if !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), "allocation not saved") {
		t.Fatalf("Allocate with a broken store: %v", err)
	}
	if p.CallCount(sampleplugin.MethodAllocate) != 1 {
		t.Fatalf("the plugin was called %d times, want 1", p.CallCount(sampleplugin.MethodAllocate))
	}
	if l := m.ListAllocations(""); len(l) != 0 {
		t.Fatalf("allocations after the failure: %+v", l)
	}
	if r := m.ListResources()[0]; r.Free != 1 || len(r.Allocated) != 1 {
		t.Fatalf("the device of the allocation taken back is free before that is saved: %+v", r)
	}

	if err := os.Mkdir(dpDir, 0o750); err != nil {
		t.Fatal(err)
	}
	got, err := m.Allocate(ctxT(t), req)
	if err != nil || len(got) != 1 || len(got[0].DeviceIDs) != 1 {
		t.Fatalf("Allocate once the store works: %+v, %v", got, err)
	}
	if r := m.ListResources()[0]; r.Free != 1 || len(r.Allocated) != 1 {
		t.Fatalf("devices once the store works: %+v; want the one allocated taken, the other free", r)
	}
	d, err := store.ReadState(dpDir)
	if err != nil || d == nil || len(d.Allocations) != 1 || len(d.Resources) != 1 {
		t.Fatalf("saved state: %+v, %v", d, err)
	}
}

// TestRegistrationNotSavedFails: a registration is acknowledged only once
// it is on disk. When the checkpoint cannot be written, Register fails
// (the endpoint is served all the same); its retry with the same
// generation succeeds once the write does, and the endpoint is then saved.
func TestRegistrationNotSavedFails(t *testing.T) {
	const res = "example.com/unsaved-registration"
	root := testutil.TempDir(t)
	m := running(t, root, Config{})
	dpDir := filepath.Join(root, "device-plugins")
	breakStore(t, dpDir) // the checkpoint cannot be written
	p := plugintest.Start(t, sampleplugin.Options{Resource: res, Devices: 2, SocketPath: filepath.Join(root, "plugins_registry", "p.sock")})
	reg := Registration{Resource: res, Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g", Path: PathPluginsRegistry}
	err := m.Register(ctxT(t), reg)
	if !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), "registration not saved") {
		t.Fatalf("Register with a broken store: %v", err)
	}
	// Retried while the store is still broken: the endpoint is live with
	// this generation, but that is not saved either.
	if err := m.Register(ctxT(t), reg); !errors.Is(err, errdefs.ErrInternal) {
		t.Fatalf("Register again with a broken store: %v", err)
	}
	testutil.Eventually(t, res+" served although not saved", func() error {
		if rs := m.ListResources(); len(rs) != 1 || rs[0].Allocatable != 2 {
			return fmt.Errorf("resources %+v", rs)
		}
		return nil
	})

	if err := os.Mkdir(dpDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := m.Register(ctxT(t), reg); err != nil {
		t.Fatalf("Register once the store works: %v", err)
	}
	d, err := store.ReadState(dpDir)
	if err != nil || d == nil || len(d.Resources) != 1 || len(d.Resources[0].Endpoints) != 1 || d.Resources[0].Endpoints[0].Generation != "g" {
		t.Fatalf("saved state: %+v, %v", d, err)
	}
}

// TestReleaseNotSavedFailsUntilSaved: a Release that cannot be saved
// fails and is taken back: the pod still holds its device, and so does
// its retry while the store is broken; the retry succeeds once the store
// works, with the release on disk.
func TestReleaseNotSavedFailsUntilSaved(t *testing.T) {
	const res = "example.com/unsaved-release"
	m, _, dpDir := registered(t, res, 2)
	req := &allocator.Request{PodUID: "pod", Container: "c", Resources: []allocator.ResourceRequest{{Name: res, Count: 1}}}
	if _, err := m.Allocate(ctxT(t), req); err != nil {
		t.Fatal(err)
	}
	breakStore(t, dpDir)
	for i := range 2 {
		n, err := m.Release(ctxT(t), "pod", "")
		if n != 0 || !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), "not saved, its devices stay allocated") {
			t.Fatalf("Release %d with a broken store: %d, %v", i+1, n, err)
		}
		if l := m.ListAllocations("pod"); len(l) != 1 {
			t.Fatalf("allocations of the pod after Release %d failed: %+v", i+1, l)
		}
	}

	if err := os.Mkdir(dpDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if n, err := m.Release(ctxT(t), "pod", ""); n != 1 || err != nil {
		t.Fatalf("Release retried once the store works: %d, %v", n, err)
	}
	d, err := store.ReadState(dpDir)
	if err != nil || d == nil || len(d.Allocations) != 0 || len(d.Resources) != 1 {
		t.Fatalf("saved state: %+v, %v", d, err)
	}
	if r := m.ListResources()[0]; r.Free != 2 {
		t.Fatalf("devices after the release: %+v", r)
	}
}

// The index of live endpoints holds exactly the endpoints not closed: a
// replaced endpoint leaves it, a deregistered one too, and a second
// resource on the same endpoint is refused through it.
func TestLiveIndex(t *testing.T) {
	m, p, _ := registered(t, "example.com/a", 1)
	indexed := func() int {
		m.mu.Lock()
		defer m.mu.Unlock()
		n := 0
		for _, set := range m.live {
			n += len(set)
		}
		return n
	}
	if n := indexed(); n != 2 { // under its path and under its socket
		t.Fatalf("index holds %d entries after one registration, want 2", n)
	}
	err := m.Register(ctxT(t), Registration{Resource: "example.com/b", Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g", Path: PathPluginsRegistry})
	if !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Fatalf("a second resource on a live endpoint: %v, want ErrAlreadyExists", err)
	}
	// A new generation replaces the endpoint: the old one leaves the index.
	if err := m.Register(ctxT(t), Registration{Resource: "example.com/a", Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g2", Path: PathPluginsRegistry}); err != nil {
		t.Fatal(err)
	}
	if n := indexed(); n != 2 {
		t.Fatalf("index holds %d entries after a replacement, want 2", n)
	}
	if _, err := m.Deregister(ctxT(t), "example.com/a", p.SocketPath(), "g2"); err != nil {
		t.Fatal(err)
	}
	if n := indexed(); n != 0 {
		t.Fatalf("index holds %d entries after deregistration, want 0", n)
	}
}
