package manager

import (
	"fmt"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
)

// validateRegistration applies the kubelet's version and resource-name
// checks, with its error messages for each registration path.
func validateRegistration(r Registration) error {
	var err error
	if r.Path == PathKubeletSock {
		// A legacy Register names exactly one version.
		v := ""
		if len(r.Versions) == 1 {
			v = r.Versions[0]
		}
		err = kubeletrules.ValidateLegacyRegister(v, r.Resource)
	} else {
		err = kubeletrules.ValidatePluginWatcher(r.Resource, r.Versions)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}
