// Package layout names every file and directory nodeplug uses beneath the
// root dir (the kubelet's, /var/lib/kubelet by default): the directories it
// shares with a kubelet, the files each service keeps there, and the paths
// built from them. It is the one home of these names; the services, the
// commands, the tests and the tools build paths beneath a root dir with the
// functions here rather than spelling names out.
//
// It imports only the standard library, so that any package may import it
// (a store or a domain package included) without depending on the runtime.
//
// The tree, with the service that owns each entry:
//
//	<root>/
//	  plugins_registry/            registration sockets plugins create (watched by the watcher)
//	  plugins/                     plugin endpoints, by the kubelet's convention (CSI, DRA drivers)
//	  device-plugins/
//	    kubelet.sock               legacy v1beta1 Registration (devicemanager)
//	    nodeplug_checkpoint        the devicemanager's checkpoint snapshot
//	    nodeplug_checkpoint.journal.<n>  its journal segments
//	    kubelet_internal_checkpoint  the mirror in the kubelet's format
//	  pod-resources/
//	    kubelet.sock               the pod resources API (devicemanager)
//	  nodeplug/                    API sockets and the files beside them (mode 0750)
//	    <service>.sock             watcher.sock, reconciler.sock, devicemanager.sock
//	    console.json               the web console's URL and token (0600)
//	    kubeconfig                 the resource API's client config for drivers
//	    kubeconfig-<identity>      ... for the other identities (operator, reader)
//	    pki/                       the resource API's CA, certificates and keys
//	    resource-api.db            the node-local resource API's objects
//	  nodeplug-<service>.lock      one instance per root dir (flock)
package layout

import "path/filepath"

// DefaultRootDir is the kubelet's root directory, every binary's default
// --root-dir.
const DefaultRootDir = "/var/lib/kubelet"

// Directories beneath the root dir.
const (
	// PluginsRegistryDirName holds the registration sockets plugins create,
	// as under a kubelet. The watcher watches it; registration through it
	// is "plugins_registry".
	PluginsRegistryDirName = "plugins_registry"

	// PluginsDirName is where, by the kubelet's convention, plugins (CSI
	// drivers, DRA drivers) put their endpoint sockets. nodeplug creates
	// nothing there; it is named so that tests and tools place endpoints
	// where a kubelet's plugins would.
	PluginsDirName = "plugins"

	// DevicePluginsDirName holds kubelet.sock, the sockets of the device
	// plugins that register on it, and the devicemanager's checkpoint.
	DevicePluginsDirName = "device-plugins"

	// PodResourcesDirName holds the socket of the kubelet's pod resources
	// API, as under a kubelet.
	PodResourcesDirName = "pod-resources"

	// DRAManagerDirName holds nodeplug-dramanager's checkpoint: the DRA
	// claims prepared on this node and its intents.
	DRAManagerDirName = "dra-manager"

	// APIDirName holds the services' API sockets and the files that sit
	// beside them (the console's file, the resource API's credentials).
	APIDirName = "nodeplug"
)

// Files in the device-plugins directory.
const (
	// KubeletSocketName is the socket that serves the legacy v1beta1
	// Registration/Register.
	KubeletSocketName = "kubelet.sock"

	// CheckpointFileName is the devicemanager's checkpoint snapshot: its
	// own format, the source of truth.
	CheckpointFileName = "nodeplug_checkpoint"

	// CheckpointJournalInfix joins the checkpoint's file name and a
	// journal segment's sequence number: nodeplug_checkpoint.journal.<n>.
	CheckpointJournalInfix = ".journal."

	// KubeletCheckpointFileName is the kubelet's device manager
	// checkpoint. The devicemanager keeps a mirror of its state there, in
	// the kubelet's format, and imports a kubelet's allocations from it at
	// a first start.
	KubeletCheckpointFileName = "kubelet_internal_checkpoint"
)

// Files in the pod-resources directory.
const (
	// PodResourcesSocketName is the socket the devicemanager serves the pod
	// resources API (k8s.io/kubelet/pkg/apis/podresources/v1) on.
	PodResourcesSocketName = "kubelet.sock"
)

// Files in the API directory (<root>/nodeplug).
const (
	// APISocketSuffix ends a service's API socket name: <service>.sock.
	APISocketSuffix = ".sock"

	// ConsoleInfoFileName is where the web console leaves its URL and
	// token (mode 0600) for nodeplugctl trace.
	ConsoleInfoFileName = "console.json"

	// KubeconfigFileName is the kubeconfig the devicemanager's node-local
	// resource API writes for DRA drivers (the driver role).
	KubeconfigFileName = "kubeconfig"

	// PKIDirName holds the node-local resource API's CA, its serving
	// certificate and the client certificates it makes (keys 0600).
	PKIDirName = "pki"

	// RegistrationsFileName is the reconciler's registrations file: the
	// plugins it registered and told so, adopted at its next start
	// without contacting them again.
	RegistrationsFileName = "registrations.json"

	// ResourceStoreFileName is the node-local resource API's store: its
	// ResourceSlices, ResourceClaims, DeviceClasses and Node.
	ResourceStoreFileName = "resource-api.db"
)

// LockFilePrefix and LockFileSuffix frame a service's lock file in the root
// dir: nodeplug-<service>.lock.
const (
	LockFilePrefix = "nodeplug-"
	LockFileSuffix = ".lock"
)

// PluginsRegistryDir returns <root>/plugins_registry.
func PluginsRegistryDir(root string) string {
	return filepath.Join(root, PluginsRegistryDirName)
}

// PluginsDir returns <root>/plugins.
func PluginsDir(root string) string {
	return filepath.Join(root, PluginsDirName)
}

// DevicePluginsDir returns <root>/device-plugins.
func DevicePluginsDir(root string) string {
	return filepath.Join(root, DevicePluginsDirName)
}

// KubeletSocket returns <root>/device-plugins/kubelet.sock.
func KubeletSocket(root string) string {
	return filepath.Join(root, DevicePluginsDirName, KubeletSocketName)
}

// CheckpointFile returns <root>/device-plugins/nodeplug_checkpoint.
func CheckpointFile(root string) string {
	return filepath.Join(root, DevicePluginsDirName, CheckpointFileName)
}

// KubeletCheckpointFile returns
// <root>/device-plugins/kubelet_internal_checkpoint.
func KubeletCheckpointFile(root string) string {
	return filepath.Join(root, DevicePluginsDirName, KubeletCheckpointFileName)
}

// DRAManagerDir returns <root>/dra-manager.
func DRAManagerDir(root string) string {
	return filepath.Join(root, DRAManagerDirName)
}

// PodResourcesDir returns <root>/pod-resources.
func PodResourcesDir(root string) string {
	return filepath.Join(root, PodResourcesDirName)
}

// PodResourcesSocket returns <root>/pod-resources/kubelet.sock.
func PodResourcesSocket(root string) string {
	return filepath.Join(root, PodResourcesDirName, PodResourcesSocketName)
}

// APIDir returns <root>/nodeplug.
func APIDir(root string) string {
	return filepath.Join(root, APIDirName)
}

// APISocket returns <root>/nodeplug/<service>.sock, the default API socket
// of a service ("watcher", "reconciler", "devicemanager", "dramanager") and the default
// address its clients dial.
func APISocket(root, service string) string {
	return filepath.Join(root, APIDirName, service+APISocketSuffix)
}

// ConsoleInfoFile returns <root>/nodeplug/console.json.
func ConsoleInfoFile(root string) string {
	return filepath.Join(root, APIDirName, ConsoleInfoFileName)
}

// KubeconfigFile returns <root>/nodeplug/kubeconfig.
func KubeconfigFile(root string) string {
	return filepath.Join(root, APIDirName, KubeconfigFileName)
}

// IdentityKubeconfigFile returns <root>/nodeplug/kubeconfig-<identity>, the
// kubeconfig of an identity other than the drivers' (KubeconfigFile).
func IdentityKubeconfigFile(root, identity string) string {
	return KubeconfigFile(root) + "-" + identity
}

// ResourceStoreFile returns <root>/nodeplug/resource-api.db.
func ResourceStoreFile(root string) string {
	return filepath.Join(root, APIDirName, ResourceStoreFileName)
}

// RegistrationsFile returns <root>/nodeplug/registrations.json.
func RegistrationsFile(root string) string {
	return filepath.Join(root, APIDirName, RegistrationsFileName)
}

// PKIDir returns <root>/nodeplug/pki.
func PKIDir(root string) string {
	return filepath.Join(root, APIDirName, PKIDirName)
}

// LockFile returns <root>/nodeplug-<service>.lock, the lock that keeps one
// instance of a service per root dir.
func LockFile(root, service string) string {
	return filepath.Join(root, LockFilePrefix+service+LockFileSuffix)
}
