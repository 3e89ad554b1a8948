package manager

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// IsExtendedResourceName reports whether name is an extended resource name
// as the kubelet defines it: it has a domain prefix that is not
// kubernetes.io, does not start with "requests.", and "requests."+name is a
// qualified name.
func IsExtendedResourceName(name string) bool {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") {
		return false
	}
	if strings.HasPrefix(name, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName("requests."+name)) == 0
}

// validateRegistration applies the kubelet's version and resource-name
// checks, with its error messages for each registration path.
func validateRegistration(r Registration) error {
	legacy := r.Path == PathKubeletSock
	if legacy {
		if len(r.Versions) != 1 || !slices.Contains(pluginapi.SupportedVersions[:], r.Versions[0]) {
			v := ""
			if len(r.Versions) > 0 {
				v = r.Versions[0]
			}
			return fmt.Errorf("requested API version %q is not supported by kubelet. Supported version is %q: %w",
				v, pluginapi.Version, errdefs.ErrInvalidArgument)
		}
		if !IsExtendedResourceName(r.Resource) {
			return fmt.Errorf("the ResourceName %q is invalid: %w", r.Resource, errdefs.ErrInvalidArgument)
		}
		return nil
	}
	if !slices.Contains(r.Versions, pluginapi.Version) {
		return fmt.Errorf("manager version, %s, is not among plugin supported versions %v: %w",
			pluginapi.Version, r.Versions, errdefs.ErrInvalidArgument)
	}
	if !IsExtendedResourceName(r.Resource) {
		return fmt.Errorf("invalid name of device plugin socket: the ResourceName %q is invalid: %w", r.Resource, errdefs.ErrInvalidArgument)
	}
	return nil
}

// keyedMutex serialises work per key.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

// Lock locks key and returns its unlock function.
func (k *keyedMutex) Lock(key string) func() {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
