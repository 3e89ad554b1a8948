package manager

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func config(dir string) Config {
	return Config{DevicePluginsDir: dir, Store: store.New(dir, store.Options{}), Log: slog.New(slog.DiscardHandler)}
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
// devicemanager restart instead of kept.
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
	if b, err := os.ReadFile(path("kubelet_internal_checkpoint")); err != nil || string(b) != "{}" {
		t.Errorf("the kubelet's checkpoint was touched: %q, %v", b, err)
	}
	// The recorded endpoints were not redialled: their resources are kept,
	// stopped, until a plugin registers or the grace period ends.
	for _, r := range m.ListResources() {
		if r.Capacity != 1 || r.Allocatable != 0 || r.Endpoints[0].State != StateStopped || r.GraceDeadline.IsZero() {
			t.Errorf("restored resource = %+v", r)
		}
	}
}
