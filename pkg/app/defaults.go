package app

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
	// DefaultAPIServerMetricsAddr is the node-local resource API's
	// (nodeplug-apiserver's) metrics address.
	DefaultAPIServerMetricsAddr = "127.0.0.1:9454"
	// DefaultDRAManagerMetricsAddr is the DRA half's
	// (nodeplug-dramanager's) metrics address.
	DefaultDRAManagerMetricsAddr = "127.0.0.1:9455"
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
