// Package kubeletrules holds the kubelet's plugin registration rules that
// more than one part of nodeplug applies (the services, and nodeplugctl
// conform, which plays the kubelet): the extended-resource-name check and
// the version checks of device, CSI and DRA plugins, with the kubelet's own
// messages (plugin authors match them against the kubelet's documentation
// and logs).
//
// The rule errors here are plain errors, as the kubelet's are; callers that
// need a gRPC code wrap them, in an *Error (error.go) when nodeplug's detail
// differs from the kubelet's words.
package kubeletrules

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// DevicePluginVersion is the device plugin API version nodeplug speaks.
const DevicePluginVersion = pluginapi.Version

// IsExtendedResourceName reports whether name is an extended resource name
// as the kubelet defines it (k8s.io/kubernetes pkg/apis/core/helper): it has a
// domain prefix outside kubernetes.io, does not start with "requests.", and
// "requests."+name is a qualified name.
func IsExtendedResourceName(name string) bool {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") || strings.HasPrefix(name, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName("requests."+name)) == 0
}

// InvalidResourceName is the kubelet's message for a bad resource name.
func InvalidResourceName(name string) error {
	return fmt.Errorf("the ResourceName %q is invalid", name)
}

// ValidateLegacyRegister applies the checks of the kubelet's
// v1beta1.Registration/Register on kubelet.sock (devicemanager
// plugin/v1beta1/server.go, validate): exactly one supported version, and an
// extended resource name.
func ValidateLegacyRegister(version, resource string) error {
	if !slices.Contains(pluginapi.SupportedVersions[:], version) {
		// The kubelet formats its whole list with %q: ["v1beta1"].
		return fmt.Errorf("requested API version %q is not supported by kubelet. Supported version is %q", version, pluginapi.SupportedVersions)
	}
	if !IsExtendedResourceName(resource) {
		return InvalidResourceName(resource)
	}
	return nil
}

// ValidatePluginWatcher applies the checks of the kubelet's device plugin
// handler for plugins found in plugins_registry (devicemanager
// plugin/v1beta1/handler.go, ValidatePlugin): the plugin's versions include
// v1beta1, and the name is an extended resource name.
func ValidatePluginWatcher(resource string, versions []string) error {
	if !slices.Contains(versions, DevicePluginVersion) {
		return fmt.Errorf("manager version, %s, is not among plugin supported versions %v", DevicePluginVersion, versions)
	}
	if !IsExtendedResourceName(resource) {
		return fmt.Errorf("invalid name of device plugin socket: %w", InvalidResourceName(resource))
	}
	return nil
}

// DRAServices are the gRPC services a DRA plugin may offer, newest first:
// a DRAPlugin's supported versions are service names, and one of these must
// be among them (the kubelet's cm/dra/plugin/dra_plugin.go).
var DRAServices = []string{"v1.DRAPlugin", "v1beta1.DRAPlugin"}

// ChooseDRAService returns the first of a DRA plugin's services that the
// kubelet supports, with the kubelet's messages when there is none.
func ChooseDRAService(services []string) (string, error) {
	if len(services) == 0 {
		return "", errors.New("empty list of supported gRPC services (aka supported versions)")
	}
	for _, s := range services {
		if slices.Contains(DRAServices, s) {
			return s, nil
		}
	}
	return "", fmt.Errorf("none of services supported by the plugin (%q) are supported by the kubelet (%q)", services, DRAServices)
}

// HighestCSIVersion returns the highest of a CSI plugin's supported
// versions, which must be a 1.x semantic version (the kubelet's
// pkg/volume/csi/csi_plugin.go, highestSupportedVersion), with the kubelet's
// messages; caller names the kubelet step ("ValidatePlugin").
func HighestCSIVersion(caller, name string, versions []string) (*utilversion.Version, error) {
	if len(versions) == 0 {
		return nil, fmt.Errorf("kubernetes.io/csi: %s for CSI driver %q failed. Plugin returned an empty list for supported versions", caller, name)
	}
	v, err := utilversion.HighestSupportedVersion(versions)
	if err != nil {
		return nil, fmt.Errorf("kubernetes.io/csi: %s for CSI driver %q failed. None of the versions specified %q are supported. err=%v", caller, name, versions, err)
	}
	return v, nil
}
