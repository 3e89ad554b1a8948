package manager

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

// flakyStore is a real store whose next Waits fail, as a write or an
// fdatasync that reports an I/O error does. With reach set the changes
// are made durable all the same (an fdatasync may report an error for
// data that reached the disk); without it they stay queued in the store,
// not on disk, until a later Wait works.
type flakyStore struct {
	store.Store
	mu    sync.Mutex
	fail  int
	reach bool
}

func (f *flakyStore) failNext(n int, reach bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail, f.reach = n, reach
}

func (f *flakyStore) Wait(t store.Ticket) error {
	f.mu.Lock()
	failing, reach := f.fail > 0, f.reach
	if failing {
		f.fail--
	}
	f.mu.Unlock()
	if !failing {
		return f.Store.Wait(t)
	}
	if reach {
		if err := f.Store.Wait(t); err != nil {
			return err
		}
	}
	return errors.New("fdatasync: input/output error (injected)")
}

// flakyManager opens a manager over a flaky store with one plugin of 2
// devices of res registered, and returns it, the store and the
// device-plugins directory.
func flakyManager(t *testing.T, res string) (*Manager, *flakyStore, string) {
	t.Helper()
	root := testutil.TempDir(t)
	dpDir := filepath.Join(root, "device-plugins")
	fs := &flakyStore{Store: store.New(dpDir, store.Options{})}
	m, err := Open(ctxT(t), Config{DevicePluginsDir: dpDir, AllowedDirs: []string{root}, Store: fs, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	p := plugintest.Start(t, sampleplugin.Options{Resource: res, Devices: 2, SocketPath: filepath.Join(root, "plugins_registry", "p.sock")})
	if err := m.Register(ctxT(t), Registration{Resource: res, Endpoint: p.SocketPath(), Versions: []string{"v1beta1"}, Generation: "g", Path: PathPluginsRegistry}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, res+" allocatable", func() error {
		if rs := m.ListResources(); len(rs) != 1 || rs[0].Allocatable != 2 {
			return fmt.Errorf("resources %+v", rs)
		}
		return nil
	})
	return m, fs, dpDir
}

// agree fails t unless memory and what a restart would read from disk now
// (a crash at this point) agree on who holds which device, and no device
// that memory would give to a pod is held on disk.
func agree(t *testing.T, m *Manager, dpDir string) {
	t.Helper()
	held := func(pod, container string, ids []string) string {
		return fmt.Sprintf("%s/%s:%s", pod, container, strings.Join(ids, ","))
	}
	var mem, disk []string
	for _, a := range m.ListAllocations("") {
		mem = append(mem, held(a.PodUID, a.Container, a.DeviceIDs))
	}
	d, err := store.ReadState(dpDir)
	if err != nil {
		t.Fatal(err)
	}
	onDisk := map[string]bool{}
	for _, a := range d.Allocations {
		disk = append(disk, held(a.PodUID, a.ContainerName, a.DeviceIDs))
		for _, id := range a.DeviceIDs {
			onDisk[id] = true
		}
	}
	if !slices.Equal(mem, disk) {
		t.Fatalf("memory holds %v, disk %v", mem, disk)
	}
	r := m.ListResources()[0]
	for _, id := range r.Healthy {
		if !slices.Contains(r.Allocated, id) && onDisk[id] {
			t.Fatalf("device %s is free in memory and held on disk", id)
		}
	}
}

// TestFailedSaveTakenBackInMemory: a Release or an Allocate whose save
// fails is taken back in memory, and at every point memory and disk agree
// on who holds each device, whether the failed write reached the disk or
// not and whether the write of the taking back fails too. A device is
// free for another pod only once its release is durable.
func TestFailedSaveTakenBackInMemory(t *testing.T) {
	const res = "example.com/flaky"
	for _, op := range []string{"release", "allocate"} {
		for _, reach := range []bool{false, true} {
			for _, fails := range []int{1, 2} {
				t.Run(fmt.Sprintf("%s, reached the disk %v, %d writes fail", op, reach, fails), func(t *testing.T) {
					m, fs, dpDir := flakyManager(t, res)
					reqA := &allocator.Request{PodUID: "pod-a", Container: "c", Resources: []allocator.ResourceRequest{{Name: res, Count: 1}}}
					if op == "release" {
						if _, err := m.Allocate(ctxT(t), reqA); err != nil {
							t.Fatal(err)
						}
					}
					fs.failNext(fails, reach)
					var err error
					if op == "release" {
						_, err = m.Release(ctxT(t), "pod-a", "")
					} else {
						_, err = m.Allocate(ctxT(t), reqA)
					}
					if !errors.Is(err, errdefs.ErrInternal) || !strings.Contains(err.Error(), "not saved") {
						t.Fatalf("%s with a failing store: %v", op, err)
					}
					agree(t, m, dpDir)
					checkTakenBack(t, m, op)
					// The store works again: the next write frees what the
					// taking back released, and memory and disk still agree.
					if _, err := m.Release(ctxT(t), "nobody", ""); err != nil {
						t.Fatal(err)
					}
					agree(t, m, dpDir)
				})
			}
		}
	}
}

// checkTakenBack fails t unless the failed op was taken back: a Release's
// pod holds its device still (which another pod cannot take), an
// Allocate's pod holds nothing.
func checkTakenBack(t *testing.T, m *Manager, op string) {
	t.Helper()
	l := m.ListAllocations("pod-a")
	if op == "allocate" {
		if len(l) != 0 {
			t.Fatalf("an Allocate not saved left %+v", l)
		}
		return
	}
	if len(l) != 1 {
		t.Fatalf("a Release not saved left pod-a with %+v", l)
	}
	req := &allocator.Request{PodUID: "pod-b", Container: "c", Resources: []allocator.ResourceRequest{{Name: "example.com/flaky", Count: 2}}}
	if _, err := m.Allocate(ctxT(t), req); err == nil {
		t.Fatal("pod-b was given pod-a's device, whose release was not saved")
	}
}
