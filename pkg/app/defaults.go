package app

import "github.com/nodeplug/nodeplug/pkg/layout"

// The defaults of nodeplug's binaries that are not paths: the services'
// metrics addresses, the console's addresses and the trace viewer's URL.
// Flags take their defaults from here. The layout beneath the root dir is
// package layout's.

// The services' default Prometheus /metrics addresses (--metrics-listen).
const (
	// DefaultWatcherMetricsAddr is the watcher's metrics address.
	DefaultWatcherMetricsAddr = "127.0.0.1:9451"
	// DefaultReconcilerMetricsAddr is the reconciler's metrics address.
	DefaultReconcilerMetricsAddr = "127.0.0.1:9452"
	// DefaultDeviceManagerMetricsAddr is the devicemanager's metrics address.
	DefaultDeviceManagerMetricsAddr = "127.0.0.1:9453"
)

// The web console's defaults (nodeplug-console): its page and its
// OTLP/gRPC trace receiver. The file where it leaves its URL and token is
// layout.ConsoleInfoFile.
const (
	DefaultConsoleAddr     = "127.0.0.1:8080"
	DefaultConsoleOTLPAddr = "127.0.0.1:4317"
)

// DefaultJaegerURL is the base URL of the Jaeger query API that nodeplugctl
// reads traces from (the port `make up` publishes).
const DefaultJaegerURL = "http://127.0.0.1:16686"

// The names below forward to package layout, their one home, for the
// importers that have not moved to it yet; new code uses layout.
const (
	DefaultRootDir            = layout.DefaultRootDir
	PluginsRegistryDirName    = layout.PluginsRegistryDirName
	DevicePluginsDirName      = layout.DevicePluginsDirName
	KubeletSocketName         = layout.KubeletSocketName
	CheckpointFileName        = layout.CheckpointFileName
	KubeletCheckpointFileName = layout.KubeletCheckpointFileName
	PodResourcesDirName       = layout.PodResourcesDirName
	PodResourcesSocketName    = layout.PodResourcesSocketName
	APIDirName                = layout.APIDirName
	ConsoleInfoFileName       = layout.ConsoleInfoFileName
)

// The path functions below forward to package layout, as the names above.
var (
	PluginsRegistryDir = layout.PluginsRegistryDir
	DevicePluginsDir   = layout.DevicePluginsDir
	KubeletSocket      = layout.KubeletSocket
	PodResourcesSocket = layout.PodResourcesSocket
	APISocket          = layout.APISocket
	ConsoleInfoFile    = layout.ConsoleInfoFile
)
