package resourceapi

import (
	"fmt"
	"net/http"
	"slices"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
)

// Roles, named by a client certificate's Organization values (the
// Kubernetes convention for groups).
const (
	// RoleDriver: ResourceSlices of this node (every verb), claims get and
	// status update, the Node get, DeviceClasses get/list/watch.
	RoleDriver = "nodeplug:driver"
	// RoleReader: get, list and watch of every kind.
	RoleReader = "nodeplug:reader"
	// RoleOperator: reader, and every kind but ResourceSlices written:
	// Namespaces, Pods, Events, ResourceClaims, ResourceClaimTemplates,
	// DeviceClasses and DeviceTaintRules.
	RoleOperator = "nodeplug:operator"
	// RoleInternal: everything; the devicemanager's own certificate.
	RoleInternal = "nodeplug:internal"
)

// user is an authenticated caller.
type user struct {
	name   string
	groups []string
}

func (u user) has(role string) bool { return slices.Contains(u.groups, role) }

// authenticate returns the caller named by its verified client
// certificate (the TLS handshake checked it against the CA), or 401.
func authenticate(r *http.Request) (user, error) {
	if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.PeerCertificates) == 0 {
		return user{}, apierrors.NewUnauthorized("Unauthorized")
	}
	c := r.TLS.PeerCertificates[0]
	return user{name: c.Subject.CommonName, groups: c.Subject.Organization}, nil
}

var readVerbs = []string{"get", "list", "watch"}

// allowed says whether u may use verb on k's subresource (the role check;
// a driver's slices are checked further by authorizeSlice).
func allowed(u user, verb string, k *kind, subresource string) bool {
	if u.has(RoleInternal) {
		return true
	}
	read := slices.Contains(readVerbs, verb)
	if read && (u.has(RoleReader) || u.has(RoleOperator)) {
		return true
	}
	if u.has(RoleOperator) && k != kindSlice && k.writable {
		return true
	}
	if !u.has(RoleDriver) {
		return false
	}
	switch k {
	case kindSlice:
		return true
	case kindClaim:
		return verb == "get" || (subresource == "status" && (verb == "update" || verb == "patch"))
	case kindNode:
		return verb == "get"
	case kindClass:
		return read
	}
	return false
}

// forbidden is the Status a client expects for a refused request.
func forbidden(u user, verb string, k *kind, name, why string) error {
	return apierrors.NewForbidden(k.groupResource(), name,
		fmt.Errorf("user %q cannot %s resource %q in API group %q: %s", u.name, verb, k.resource, k.gvk.Group, why))
}

// driverOnly reports whether u's writes to slices are limited to this
// node's (a driver, not internal).
func driverOnly(u user) bool { return !u.has(RoleInternal) }

// authorizeSlice checks that a driver writes only slices of node: the
// object written and the one it replaces must both name it. Objects that
// are not slices pass.
func authorizeSlice(u user, verb, node string, objs ...runtime.Object) error {
	if !driverOnly(u) {
		return nil
	}
	for _, o := range objs {
		s, ok := o.(*resourcev1.ResourceSlice)
		if !ok || s == nil {
			continue
		}
		if got := nodeNameOf(s); got != node {
			return forbidden(u, verb, kindSlice, s.Name,
				fmt.Sprintf("a driver may write only ResourceSlices with spec.nodeName %q (this one has %q)", node, got))
		}
	}
	return nil
}

// authorizeSliceCollection checks that a driver's deletecollection is
// limited to this node's slices by its field selector.
func authorizeSliceCollection(u user, node string, sel fields.Selector) error {
	if !driverOnly(u) {
		return nil
	}
	if v, ok := sel.RequiresExactMatch(resourcev1.ResourceSliceSelectorNodeName); ok && v == node {
		return nil
	}
	return forbidden(u, "deletecollection", kindSlice, "",
		fmt.Sprintf("a driver must select spec.nodeName=%s", node))
}
