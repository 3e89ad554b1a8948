// Package conform checks a plugin against the kubelet's contract, playing
// the kubelet: it registers the plugin as the kubelet would (GetInfo, the
// calls of the handler for its type, and NotifyRegistrationStatus with the
// outcome for a plugins_registry socket, or
// v1beta1.Registration/Register on its own kubelet.sock), then calls the
// device plugin API with the kubelet's rules and timeouts, and, when it
// starts the plugin itself, takes it through a kubelet restart, the removal
// of its socket and SIGTERM.
//
// The rules are the ones nodeplug's services apply (pkg/kubeletrules,
// pkg/bounds, pkg/unixsock's confinement); every plugin socket is dialled
// by its raw path (pkg/rpcutil). Each check ends as pass, warn, fail or skip
// (not applicable, or not selected with Only), with what the plugin did and
// what the kubelet does, and where (Catalogue).
//
// Run is the entry point; nodeplugctl conform is its command line.
package conform

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Status is the outcome of one check.
type Status string

// The outcomes. Skip means the check does not apply to this plugin (a
// GetPreferredAllocation check for a plugin that does not offer it) or
// could not run because an earlier step failed; the detail says which.
const (
	Pass Status = "pass"
	Warn Status = "warn"
	Fail Status = "fail"
	Skip Status = "skip"
)

// The check names, as --only and --skip take them.
const (
	CheckGetInfo            = "getinfo"
	CheckDriverService      = "driver-service"
	CheckNotify             = "notify"
	CheckRegisterRequest    = "register-request"
	CheckOptions            = "options"
	CheckFirstResponse      = "listandwatch-first"
	CheckDeviceIDs          = "device-ids"
	CheckHealth             = "health"
	CheckTopology           = "topology"
	CheckHealthFlap         = "health-flap"
	CheckAllocate           = "allocate"
	CheckAllocateUnknown    = "allocate-unknown"
	CheckPreferred          = "preferred-allocation"
	CheckPreStart           = "prestart"
	CheckConcurrentAllocate = "allocate-concurrent"
	CheckReconnect          = "reconnect"
	CheckKubeletRestart     = "kubelet-restart"
	CheckSocketRemoval      = "socket-removal"
	CheckSIGTERM            = "sigterm"
)

// Check describes one check: what it checks, what the kubelet does, and
// where the kubelet does it (paths in kubernetes/kubernetes, v1.37).
type Check struct {
	Name    string `json:"name"`
	Title   string `json:"title"`
	Kubelet string `json:"kubelet"`
	Ref     string `json:"ref"`
	// Lifecycle checks need conform to start the plugin (-- CMD ARGS).
	Lifecycle bool `json:"lifecycle,omitempty"`
}

// Kubelet source paths the catalogue cites.
const (
	refOpGen      = "pkg/kubelet/pluginmanager/operationexecutor/operation_generator.go"
	refDMHandler  = "pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go"
	refDMServer   = "pkg/kubelet/cm/devicemanager/plugin/v1beta1/server.go"
	refDMClient   = "pkg/kubelet/cm/devicemanager/plugin/v1beta1/client.go"
	refDMManager  = "pkg/kubelet/cm/devicemanager/manager.go"
	refDMEndpoint = "pkg/kubelet/cm/devicemanager/endpoint.go"
	refWatcher    = "pkg/kubelet/pluginmanager/pluginwatcher/plugin_watcher.go"
)

// Catalogue lists every check in the order Run performs them.
var Catalogue = []Check{
	{CheckGetInfo, "GetInfo: known type, a name valid for the type, supported versions, an endpoint that can be dialled",
		"calls GetInfo with a 1 s timeout; an unknown type or a failed validation (DevicePlugin: versions include v1beta1 and the name is an extended resource name; CSIPlugin: a 1.x version; DRAPlugin: v1.DRAPlugin or v1beta1.DRAPlugin) is told to the plugin with NotifyRegistrationStatus(false) and retried with backoff up to 2m2s; an empty endpoint means the registration socket",
		refOpGen + ":85-144, " + refDMHandler + ":61-75", false},
	{CheckDriverService, "CSI: NodeGetInfo answers with a node ID; DRA: the endpoint serves the DRA service chosen from the versions",
		"CSI: calls NodeGetInfo on the endpoint at registration and fails the registration (NotifyRegistrationStatus(false)) when it fails or names no node; DRA: connects to the endpoint and sends NodePrepareResources to the chosen service, which fails every pod of a driver that does not serve it",
		"pkg/volume/csi/csi_plugin.go (RegisterPlugin), pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go", false},
	{CheckNotify, "NotifyRegistrationStatus answers",
		"tells the plugin the outcome with a 5 s timeout; when telling it success fails, it deregisters the plugin and retries",
		refOpGen + ":171-189", false},
	{CheckRegisterRequest, "Register on kubelet.sock: version v1beta1, an extended resource name, the endpoint a socket file name in device-plugins/",
		"checks the version and the name, joins the endpoint to the device-plugins directory and connects before Register returns; the options in the request are ignored (GetDevicePluginOptions decides)",
		refDMServer + ":159-182", true},
	{CheckOptions, "GetDevicePluginOptions answers",
		"calls it once when connecting (after a 10 s blocking dial); a failure rejects the plugin (\"failed to get device plugin options\") and its resource never appears",
		refDMClient + ":67-79, " + refDMManager + ":240-276", false},
	{CheckFirstResponse, "the first ListAndWatch response arrives in time",
		"opens ListAndWatch once after connecting; capacity comes only from its responses; a stream that ends is never reopened: the plugin must register again",
		refDMHandler + ":152-164", false},
	{CheckDeviceIDs, "device IDs are unique, non-empty and printable",
		"keys devices by ID: a repeated ID collapses into one device; IDs end up in the checkpoint, container environment and pod resources API",
		refDMManager + ":326-379", false},
	{CheckHealth, "device health is \"Healthy\" or \"Unhealthy\"",
		"counts a device healthy only when its health is exactly \"Healthy\"; any other value is unhealthy",
		refDMManager + ":326-379", false},
	{CheckTopology, "topology is sane: NUMA node IDs non-negative, not repeated, present on this host",
		"files each device under every NUMA node ID it names to build topology hints; a device without topology goes under -1",
		refDMManager + ":959-1068, pkg/kubelet/cm/devicemanager/topology_hints.go", false},
	{CheckHealthFlap, "periodic resends do not flap health",
		"replaces the resource's device sets with every response and writes its checkpoint; a device that flips back and forth is unallocatable at random",
		refDMManager + ":326-379", false},
	{CheckAllocate, "Allocate returns one container response per container request, for every healthy device",
		"sends one ContainerAllocateRequest per container and uses ContainerResponses[0]; an empty response fails the pod's admission",
		refDMManager + ":959-1068", false},
	{CheckAllocateUnknown, "Allocate of a device the plugin does not have is an error (a success warns)",
		"only asks for devices the plugin listed, so it never sends an unknown ID; a plugin that accepts any ID only hides a caller's mistake (the upstream sample plugin refuses unknown IDs)",
		"test/images/sample-device-plugin/sampledeviceplugin.go", false},
	{CheckPreferred, "GetPreferredAllocation, when offered: a subset of the available devices, with the must-include ones, of the requested size",
		"takes the answered IDs that are available, in order, and fills the rest itself; a bad answer is tolerated (a warn here), only a failed call fails the allocation",
		refDMManager + ":1164-1187", false},
	{CheckPreStart, "PreStartContainer, when required, answers within 30 s",
		"calls it before every container start with a 30 s timeout; an error fails the container start",
		refDMManager + ":1130-1160, " + refDMEndpoint + ":125", false},
	{CheckConcurrentAllocate, "concurrent Allocate calls all succeed",
		"drops its lock around the Allocate call, so the containers of several pods are allocated concurrently; nodeplug's devicemanager serves concurrent callers",
		refDMManager + ":959-1068", false},
	{CheckReconnect, "twice: after the manager closes ListAndWatch and opens it again, the plugin keeps serving and sends to the new stream",
		"a restarted kubelet dials again and opens a new ListAndWatch; the old stream's connection is gone, and a plugin that stops serving when a send fails (often a second after the stream of the restart before ended) drops off the node",
		refDMHandler + ":152-164, " + refDMClient, false},
	{CheckKubeletRestart, "after kubelet.sock is re-created the plugin registers again",
		"at start removes every socket in device-plugins/ (the plugin's too) and creates kubelet.sock: kubelet.sock plugins must Register again, plugins_registry plugins are found again by its walk",
		refDMManager + ":204-236, " + refDMServer + ":86-128", true},
	{CheckSocketRemoval, "what the plugin does when its own socket is removed (recorded; a crash fails)",
		"deregisters a plugins_registry plugin whose socket is removed, and nothing reconnects until the socket is created again; a kubelet.sock plugin's stream lives on",
		refWatcher + ":209-216", true},
	{CheckSIGTERM, "on SIGTERM the plugin exits and removes its socket",
		"finds a socket left behind at its next start; in plugins_registry a stale socket fails registration again and again, backing off up to 2m2s",
		refOpGen + ":192-209, pkg/util/goroutinemap/exponentialbackoff/exponential_backoff.go", true},
}

// Lookup returns the check named name.
func Lookup(name string) (Check, bool) {
	i := slices.IndexFunc(Catalogue, func(c Check) bool { return c.Name == name })
	if i < 0 {
		return Check{}, false
	}
	return Catalogue[i], true
}

// Names returns every check name, in order.
func Names() []string {
	out := make([]string, len(Catalogue))
	for i, c := range Catalogue {
		out[i] = c.Name
	}
	return out
}

// Result is the outcome of one check.
type Result struct {
	Check
	Status Status `json:"status"`
	// Detail says what the plugin did.
	Detail string `json:"detail"`
	// Elapsed is how long the check took.
	Elapsed time.Duration `json:"elapsed_ns"`
}

// Report is the outcome of a run.
type Report struct {
	// Target is the socket or the command checked.
	Target string `json:"target"`
	// Path is how the plugin registered: PathRegistry, PathKubeletSock,
	// or, for a socket given directly, PathRegistrationSocket or
	// PathDeviceSocket.
	Path string `json:"registration_path"`
	// Plugin names the plugin: its resource or driver name.
	Plugin string `json:"plugin,omitempty"`
	// Resources are the resources whose device plugin checks ran, in the
	// order they registered: a plugin that serves several registers each
	// (on kubelet.sock or with a socket in plugins_registry), and the
	// result of each device check names every one.
	Resources []string `json:"resources,omitempty"`
	Results   []Result `json:"results"`
	// PluginOutput is the tail of the started plugin's output, when a
	// check failed.
	PluginOutput string `json:"plugin_output,omitempty"`
}

// Failed reports whether any check failed.
func (r *Report) Failed() bool { return r.Count(Fail) > 0 }

// Count returns the number of results with status s.
func (r *Report) Count(s Status) int {
	n := 0
	for _, res := range r.Results {
		if res.Status == s {
			n++
		}
	}
	return n
}

// Result returns the result of the named check.
func (r *Report) Result(name string) (Result, bool) {
	i := slices.IndexFunc(r.Results, func(res Result) bool { return res.Name == name })
	if i < 0 {
		return Result{}, false
	}
	return r.Results[i], true
}

// Selection picks checks by name: Only (empty: all) minus Skip.
type Selection struct {
	Only, Skip []string
}

// Validate reports names that are not checks.
func (s Selection) Validate() error {
	var bad []string
	for _, n := range append(slices.Clone(s.Only), s.Skip...) {
		if _, ok := Lookup(n); !ok {
			bad = append(bad, n)
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("unknown check %s (checks: %s)", strings.Join(bad, ", "), strings.Join(Names(), ", "))
	}
	return nil
}

// Selected reports whether the check named name runs.
func (s Selection) Selected(name string) bool {
	if len(s.Only) > 0 && !slices.Contains(s.Only, name) {
		return false
	}
	return !slices.Contains(s.Skip, name)
}
