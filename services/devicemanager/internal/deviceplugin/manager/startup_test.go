package manager

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func config(dir string) Config {
	return Config{DevicePluginsDir: dir, Store: store.New(dir, store.Options{}), Log: slog.New(slog.DiscardHandler)}
}

// openLogged opens a manager over dir with its log kept in logs; the test's
// cleanup closes it.
func openLogged(t *testing.T, dir string) (m *Manager, logs *bytes.Buffer) {
	t.Helper()
	logs = new(bytes.Buffer)
	cfg := config(dir)
	cfg.Log = slog.New(slog.NewTextHandler(logs, nil))
	m, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m, logs
}

// rudeSocket listens at path and closes every connection at once: the
// socket answers, but no gRPC server is behind it, so a redial fails.
func rudeSocket(t *testing.T, path string) {
	t.Helper()
	l, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = l.Close(); <-done })
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

func TestOpenRefusesLiveKubeletSock(t *testing.T) {
	dir := testutil.TempDir(t)
	lis, err := unixsock.Listen(KubeletSocketPath(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = lis.Close() }()
	if _, err := Open(context.Background(), config(dir)); !errors.Is(err, ErrKubeletRunning) {
		t.Fatalf("Open with a live kubelet.sock: %v", err)
	}
}

// TestOpenRemovesOnlyDeadUnrecordedSockets: at start, a socket in
// device-plugins is removed only when it refuses connections and no
// recorded endpoint names it. A recorded endpoint whose redial failed while
// its plugin still answers keeps its socket: removing it made a legacy
// plugin restart its server, so its endpoint was replaced across a
// devicemanager restart instead of kept. The file kubelet_internal_checkpoint
// is not a socket and stays; with nodeplug's own checkpoint there, it is
// not imported but rewritten as the mirror of the restored state.
func TestOpenRemovesOnlyDeadUnrecordedSockets(t *testing.T) {
	dir := testutil.TempDir(t)
	testutil.StaleSocket(t, KubeletSocketPath(dir)) // a stale kubelet.sock does not stop the start
	path := func(name string) string { return filepath.Join(dir, name) }
	rudeSocket(t, path("rude.sock"))
	rudeSocket(t, path("unrecorded-alive.sock"))
	testutil.StaleSocket(t, path("recorded-dead.sock"))
	testutil.StaleSocket(t, path("stale.sock"))
	if err := os.WriteFile(path("kubelet_internal_checkpoint"), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	recorded := func(resource, name string) store.Resource {
		return store.Resource{Name: resource, Devices: []store.Device{{ID: "d0", Healthy: true}}, Endpoints: []store.Endpoint{{
			Endpoint: path(name), SocketPath: path(name), Generation: "g", RegistrationPath: string(PathKubeletSock),
			Versions: []string{"v1beta1"}, Primary: true,
		}}}
	}
	saved := store.New(dir, store.Options{})
	if _, err := saved.Load(); err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(saved, store.Batch{Resources: []store.Resource{
		recorded("example.com/rude", "rude.sock"), recorded("example.com/dead", "recorded-dead.sock"),
	}}); err != nil {
		t.Fatal(err)
	}
	if err := saved.Flush(); err != nil {
		t.Fatal(err)
	}

	m, err := Open(context.Background(), config(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	}()
	for name, want := range map[string]bool{
		"rude.sock": true, "unrecorded-alive.sock": true, "recorded-dead.sock": true, "stale.sock": false,
		KubeletSocketName: true, "kubelet_internal_checkpoint": true,
	} {
		if got := exists(path(name)); got != want {
			t.Errorf("%s present = %v, want %v", name, got, want)
		}
	}
	// The recorded resources, no device healthy, and no allocation.
	testutil.Eventually(t, "the kubelet-format mirror of the restored state", func() error {
		allocs, regs, err := store.ReadKubelet(path("kubelet_internal_checkpoint"))
		if err != nil {
			return err
		}
		if want := map[string][]string{"example.com/rude": {}, "example.com/dead": {}}; len(allocs) != 0 || !reflect.DeepEqual(regs, want) {
			return fmt.Errorf("allocations %v, registered devices %v; want none and %v", allocs, regs, want)
		}
		return nil
	})
	// The recorded endpoints were not redialled: their resources are kept,
	// stopped, until a plugin registers or the grace period ends.
	for _, r := range m.ListResources() {
		if r.Capacity != 1 || r.Allocatable != 0 || r.Endpoints[0].State != StateStopped || r.GraceDeadline.IsZero() {
			t.Errorf("restored resource = %+v", r)
		}
	}
}

// TestOpenImportsKubeletAllocations: at a first start (no nodeplug
// checkpoint) beside a kubelet's checkpoint, the manager starts with the
// kubelet's allocations, logs what it took, and keeps them in its own
// checkpoint; the kubelet's file becomes the mirror. The kubelet's file
// here is a previous manager's mirror: the same format.
func TestOpenImportsKubeletAllocations(t *testing.T) {
	first := testutil.TempDir(t)
	saved := store.New(first, store.Options{})
	if _, err := saved.Load(); err != nil {
		t.Fatal(err)
	}
	if err := store.Commit(saved, store.Batch{Allocations: []store.Allocation{
		{PodUID: "pod-1", ContainerName: "c", ResourceName: "example.com/r", DeviceIDs: []string{"d0", "d1"}, Response: []byte{}},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := saved.Flush(); err != nil {
		t.Fatal(err)
	}
	m, err := Open(context.Background(), config(first))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	kubelet, err := os.ReadFile(filepath.Join(first, "kubelet_internal_checkpoint"))
	if err != nil {
		t.Fatal(err)
	}

	dir := testutil.TempDir(t)
	if err := os.WriteFile(filepath.Join(dir, "kubelet_internal_checkpoint"), kubelet, 0o600); err != nil {
		t.Fatal(err)
	}
	m, logs := openLogged(t, dir)
	got := m.ListAllocations("")
	if len(got) != 1 || got[0].PodUID != "pod-1" || !reflect.DeepEqual(got[0].DeviceIDs, []string{"d0", "d1"}) {
		t.Fatalf("allocations after the import: %+v", got)
	}
	if !strings.Contains(logs.String(), "imported the kubelet's allocations") || !strings.Contains(logs.String(), "allocations=1") {
		t.Errorf("no log of the import:\n%s", logs.String())
	}
	if d, err := store.ReadState(dir); err != nil || d == nil || len(d.Allocations) != 1 {
		t.Fatalf("nodeplug's checkpoint after the import: %+v, %v", d, err)
	}
}

// TestOpenMovesAsideUnreadableKubeletCheckpoint: a kubelet checkpoint
// that does not verify, at a first start, is moved aside with one loud
// line naming both places, and the manager starts empty.
func TestOpenMovesAsideUnreadableKubeletCheckpoint(t *testing.T) {
	dir := testutil.TempDir(t)
	path := filepath.Join(dir, "kubelet_internal_checkpoint")
	if err := os.WriteFile(path, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	m, logs := openLogged(t, dir)
	aside, _ := filepath.Glob(path + ".corrupt-*")
	if len(aside) != 1 {
		t.Fatalf("moved aside: %v", aside)
	}
	if b, err := os.ReadFile(aside[0]); err != nil || string(b) != "{}" {
		t.Fatalf("the file moved aside: %q, %v", b, err)
	}
	if n := strings.Count(logs.String(), "CHECKPOINT UNUSABLE"); n != 1 || !strings.Contains(logs.String(), aside[0]) {
		t.Fatalf("%d loud lines, want one naming %s:\n%s", n, aside[0], logs.String())
	}
	if len(m.ListAllocations("")) != 0 {
		t.Fatal("allocations from an unreadable file")
	}
}
