package claims

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// validate checks a PrepareRequest as the API server checks a pod's
// resourceClaims and containers' resources.claims; an error names the
// field and wraps errdefs.ErrInvalidArgument.
func validate(req *PrepareRequest) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("prepare: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
	}
	switch {
	case req.Pod.UID == "":
		return bad("pod.uid is empty")
	case len(req.Pod.UID) > 128:
		return bad("pod.uid is %d bytes, more than 128", len(req.Pod.UID))
	}
	if errs := validation.IsDNS1123Label(req.Pod.Namespace); len(errs) > 0 {
		return bad("pod.namespace %q: %s", req.Pod.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(req.Pod.Name); len(errs) > 0 {
		return bad("pod.name %q: %s", req.Pod.Name, strings.Join(errs, "; "))
	}
	if len(req.PodClaims) == 0 {
		return bad("pod_claims is empty")
	}
	names := make(map[string]bool, len(req.PodClaims))
	for i, pc := range req.PodClaims {
		if errs := validation.IsDNS1123Label(pc.Name); len(errs) > 0 {
			return bad("pod_claims[%d].name %q: %s", i, pc.Name, strings.Join(errs, "; "))
		}
		if names[pc.Name] {
			return bad("pod_claims[%d].name %q is repeated", i, pc.Name)
		}
		names[pc.Name] = true
		if errs := validation.IsDNS1123Subdomain(pc.ResourceClaimName); len(errs) > 0 {
			return bad("pod_claims[%d].resource_claim_name %q: %s", i, pc.ResourceClaimName, strings.Join(errs, "; "))
		}
	}
	containers := make(map[string]bool, len(req.Containers))
	for i, c := range req.Containers {
		if errs := validation.IsDNS1123Label(c.Container); len(errs) > 0 {
			return bad("containers[%d].name %q: %s", i, c.Container, strings.Join(errs, "; "))
		}
		if containers[c.Container] {
			return bad("containers[%d].name %q is repeated", i, c.Container)
		}
		containers[c.Container] = true
		for j, cc := range c.Claims {
			if !names[cc.Name] {
				return bad("containers[%d].claims[%d].name %q names no pod claim", i, j, cc.Name)
			}
			if cc.Request == "" {
				continue
			}
			for _, part := range strings.SplitN(cc.Request, "/", 2) {
				if errs := validation.IsDNS1123Label(part); len(errs) > 0 {
					return bad("containers[%d].claims[%d].request %q: %s", i, j, cc.Request, strings.Join(errs, "; "))
				}
			}
		}
	}
	return nil
}
