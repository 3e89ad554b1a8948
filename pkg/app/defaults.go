package app

import "path/filepath"

// The defaults of nodeplug's binaries, in one place: the layout beneath the
// root dir (the kubelet's), the services' gRPC and metrics addresses, and
// the address of the trace viewer nodeplugctl reads. Flags take their
// defaults from here; tests and tools that build paths beneath a root dir
// use the file and directory names here rather than spelling them out.
//
// The default root dir itself is DefaultRootDir, beside Config.
const (
	// PluginsRegistryDirName is the directory beneath the root dir in which
	// plugins create their registration sockets, as under a kubelet. The
	// watcher watches it; registration through it is "plugins_registry".
	PluginsRegistryDirName = "plugins_registry"

	// DevicePluginsDirName is the directory beneath the root dir that holds
	// kubelet.sock, the sockets of the device plugins that register on it,
	// and the devicemanager's checkpoint.
	DevicePluginsDirName = "device-plugins"

	// KubeletSocketName is the file name, in the device-plugins directory,
	// of the socket that serves the legacy v1beta1 Registration/Register.
	KubeletSocketName = "kubelet.sock"

	// CheckpointFileName is the file name, in the device-plugins directory,
	// of the devicemanager's checkpoint: its own format, the source of
	// truth.
	CheckpointFileName = "nodeplug_checkpoint"

	// KubeletCheckpointFileName is the file name, in the device-plugins
	// directory, of the kubelet's device manager checkpoint. The
	// devicemanager keeps a mirror of its state there, in the kubelet's
	// format, and imports a kubelet's allocations from it at a first start.
	KubeletCheckpointFileName = "kubelet_internal_checkpoint"

	// PodResourcesDirName is the directory beneath the root dir that holds
	// the socket of the kubelet's pod resources API, as under a kubelet.
	PodResourcesDirName = "pod-resources"

	// PodResourcesSocketName is the file name, in the pod-resources
	// directory, of the socket the devicemanager serves the pod resources
	// API (k8s.io/kubelet/pkg/apis/podresources/v1) on.
	PodResourcesSocketName = "kubelet.sock"
)

// The services' default Prometheus /metrics addresses (--metrics-listen).
const (
	// DefaultWatcherMetricsAddr is the watcher's metrics address.
	DefaultWatcherMetricsAddr = "127.0.0.1:9451"
	// DefaultReconcilerMetricsAddr is the reconciler's metrics address.
	DefaultReconcilerMetricsAddr = "127.0.0.1:9452"
	// DefaultDeviceManagerMetricsAddr is the devicemanager's metrics address.
	DefaultDeviceManagerMetricsAddr = "127.0.0.1:9453"
)

// The web console's defaults (nodeplug-console): its page, its OTLP/gRPC
// trace receiver, and the file beneath the root dir where it leaves its URL
// and token (mode 0600) for nodeplugctl trace.
const (
	DefaultConsoleAddr     = "127.0.0.1:8080"
	DefaultConsoleOTLPAddr = "127.0.0.1:4317"
	ConsoleInfoFileName    = "console.json"
)

// ConsoleInfoFile returns <root>/nodeplug/console.json, beside the API
// sockets.
func ConsoleInfoFile(root string) string {
	return filepath.Join(root, APIDirName, ConsoleInfoFileName)
}

// DefaultJaegerURL is the base URL of the Jaeger query API that nodeplugctl
// reads traces from (the port `make up` publishes).
const DefaultJaegerURL = "http://127.0.0.1:16686"

// PluginsRegistryDir returns <root>/plugins_registry.
func PluginsRegistryDir(root string) string {
	return filepath.Join(root, PluginsRegistryDirName)
}

// DevicePluginsDir returns <root>/device-plugins.
func DevicePluginsDir(root string) string {
	return filepath.Join(root, DevicePluginsDirName)
}

// KubeletSocket returns <root>/device-plugins/kubelet.sock.
func KubeletSocket(root string) string {
	return filepath.Join(root, DevicePluginsDirName, KubeletSocketName)
}

// PodResourcesSocket returns <root>/pod-resources/kubelet.sock.
func PodResourcesSocket(root string) string {
	return filepath.Join(root, PodResourcesDirName, PodResourcesSocketName)
}
