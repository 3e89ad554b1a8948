package upstream

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"k8s.io/klog/v2"
	plugin "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// TestStubThroughPluginsRegistry: the upstream Stub serves the plugin
// watcher's Registration service beside its device plugin; with its socket
// in plugins_registry, the three services register it (GetInfo names no
// endpoint, so the socket is the endpoint, as in the kubelet), its devices
// allocate, and removing its socket takes it away.
func TestStubThroughPluginsRegistry(t *testing.T) {
	root, _, conn := startStack(t, 2*time.Minute, "devicemanager")
	d := &dm{t: t, root: root, dpDir: filepath.Join(root, "device-plugins"), conn: conn, client: dmv1.NewDeviceManagerServiceClient(conn)}

	const res = "example.com/registry-stub"
	sock := filepath.Join(root, "plugins_registry", "registry-stub.sock")
	s := plugin.NewDevicePluginStub(logger(), devices("r-1", "r-2"), sock, res, false, false)
	s.SetAllocFunc(echoAlloc)
	if err := s.Start(klog.NewContext(context.Background(), logger())); err != nil {
		t.Fatalf("Stub Start: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = s.Stop(logger())
		}
	})

	r := d.waitLive(res, 2, nil)
	if ep := r.GetEndpoints()[0]; ep.GetEndpoint() != sock || ep.GetSocketPath() != sock ||
		ep.GetRegistrationPath() != dmv1.RegistrationPath_REGISTRATION_PATH_PLUGINS_REGISTRY {
		t.Fatalf("endpoint = %v", ep)
	}
	a, err := allocate(t, d, "pod", res, 2)
	if err != nil || !slices.Equal(a.GetDeviceIds(), []string{"r-1", "r-2"}) ||
		a.GetContainerResponse().GetEnvs()["STUB_DEVICES"] != "[r-1 r-2]" {
		t.Fatalf("Allocate: %v, %v", a, err)
	}

	// Stop removes the socket: the plugin is deregistered and its devices
	// are no longer allocatable (capacity stays for the grace period).
	if err := s.Stop(logger()); err != nil {
		t.Fatal(err)
	}
	stopped = true
	testutil.Eventually(t, "the stopped Stub's devices unallocatable", func() error {
		if r := d.resource(res); r != nil && r.GetAllocatable() != 0 {
			return fmt.Errorf("last: %v", r)
		}
		return nil
	})
}
