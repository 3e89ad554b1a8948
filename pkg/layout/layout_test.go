package layout_test

import (
	"path/filepath"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/layout"
)

// The kubelet's own constants: the device plugin API's paths under the
// default root dir are where nodeplug puts them.
func TestKubeletPaths(t *testing.T) {
	if got, want := layout.DevicePluginsDir(layout.DefaultRootDir)+"/", pluginapi.DevicePluginPath; got != want {
		t.Errorf("DevicePluginsDir(DefaultRootDir) = %q, the kubelet's DevicePluginPath is %q", got, want)
	}
	if got, want := layout.KubeletSocket(layout.DefaultRootDir), pluginapi.KubeletSocket; got != want {
		t.Errorf("KubeletSocket(DefaultRootDir) = %q, the kubelet's KubeletSocket is %q", got, want)
	}
}

func TestPaths(t *testing.T) {
	root := "/r"
	for _, tc := range []struct{ got, want string }{
		{layout.PluginsRegistryDir(root), "/r/plugins_registry"},
		{layout.PluginsDir(root), "/r/plugins"},
		{layout.DevicePluginsDir(root), "/r/device-plugins"},
		{layout.KubeletSocket(root), "/r/device-plugins/kubelet.sock"},
		{layout.CheckpointFile(root), "/r/device-plugins/nodeplug_checkpoint"},
		{layout.KubeletCheckpointFile(root), "/r/device-plugins/kubelet_internal_checkpoint"},
		{layout.PodResourcesDir(root), "/r/pod-resources"},
		{layout.PodResourcesSocket(root), "/r/pod-resources/kubelet.sock"},
		{layout.APIDir(root), "/r/nodeplug"},
		{layout.APISocket(root, "watcher"), "/r/nodeplug/watcher.sock"},
		{layout.ConsoleInfoFile(root), "/r/nodeplug/console.json"},
		{layout.KubeconfigFile(root), "/r/nodeplug/kubeconfig"},
		{layout.PKIDir(root), "/r/nodeplug/pki"},
		{layout.IdentityKubeconfigFile(root, "operator"), "/r/nodeplug/kubeconfig-operator"},
		{layout.ResourceStoreFile(root), "/r/nodeplug/resource-api.db"},
		{layout.LockFile(root, "devicemanager"), "/r/nodeplug-devicemanager.lock"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	// A root given with a trailing slash or dots gives the same paths.
	if got := layout.APISocket("/r/./x/../", "reconciler"); got != filepath.Clean("/r/nodeplug/reconciler.sock") {
		t.Errorf("APISocket of an unclean root = %q", got)
	}
}
