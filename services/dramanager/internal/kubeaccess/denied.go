package kubeaccess

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// Manifest is where the permissions the dramanager needs are granted
// (deploy/rbac/nodeplug.yaml, relative to the repository's root); the
// refusals name it.
const Manifest = "deploy/rbac/nodeplug.yaml"

// PermissionError is a request the Kubernetes API refused the dramanager
// for want of a permission: a 403, a 401 (its credentials were not
// accepted) or a 422 whose cause is a field the API forbids changing
// without a further permission (resourceclaims/binding). It wraps the
// API's error and errdefs.ErrPermissionDenied: a caller sees
// PERMISSION_DENIED.
type PermissionError struct {
	// Code is the API's HTTP status: 401, 403 or 422.
	Code int32
	// Verb, Group and Resource (resource[/subresource]) are the
	// permission refused, as the API named it; empty when it did not
	// (a 401, or a 403 whose message is not kube-apiserver's).
	Verb, Group, Resource string
	// Identity is who was refused: the user the API's message names, or
	// the identity the dramanager learnt at start.
	Identity string
	// Err is the API's error.
	Err error
}

func (e *PermissionError) Error() string {
	api := e.Err.Error()
	switch {
	case e.Code == http.StatusUnauthorized:
		return fmt.Sprintf("the Kubernetes API did not accept the dramanager's credentials (401 Unauthorized; its identity: %s): %s: "+
			"give it credentials the cluster accepts (--kubeconfig): %v", e.Identity, api, errdefs.ErrPermissionDenied)
	case e.Verb == "":
		return fmt.Sprintf("the Kubernetes API refused a request on %s to %s: %s (the permissions it needs: %s): %v",
			e.what(), e.Identity, api, Manifest, errdefs.ErrPermissionDenied)
	case e.Code == http.StatusUnprocessableEntity:
		return fmt.Sprintf("the Kubernetes API requires %s on %s for this change, which %s lacks: %s (grant it: %s): %v",
			e.Verb, e.what(), e.Identity, api, Manifest, errdefs.ErrPermissionDenied)
	}
	return fmt.Sprintf("the Kubernetes API refused %s on %s to %s: %s (grant it: %s): %v",
		e.Verb, e.what(), e.Identity, api, Manifest, errdefs.ErrPermissionDenied)
}

func (e *PermissionError) what() string {
	if e.Resource == "" {
		return "a resource (API group " + groupName(e.Group) + ")"
	}
	return e.Resource + " (" + groupName(e.Group) + ")"
}

// Unwrap returns the API's error and errdefs.ErrPermissionDenied.
func (e *PermissionError) Unwrap() []error { return []error{e.Err, errdefs.ErrPermissionDenied} }

var (
	// forbiddenRE is kube-apiserver's 403 (responsewriters'
	// forbiddenMessage); nodeplug-apiserver's says "user" in lower case.
	forbiddenRE = regexp.MustCompile(`(?i)\buser "([^"]*)" cannot (\S+) resource "([^"]+)" in API group "([^"]*)"`)
	// requiresRE is the field error of kube-apiserver's checks of a
	// synthetic subresource (pkg/registry/resource: AuthorizedForBinding).
	requiresRE = regexp.MustCompile(`requires resource="([^"]+)", verb="([^"]+)" permission`)
)

// Denied returns err as a *PermissionError (with the ErrorInfo reason
// errdefs.ReasonKubernetesAPIDenied, naming the verb, the resource and
// the identity) when the API refused the request for want of a
// permission, naming id as the one refused where the API's answer does
// not name the user; nil for any other error.
func Denied(err error, id *Identity) error {
	var se apierrors.APIStatus
	if err == nil || !errors.As(err, &se) {
		return nil
	}
	st := se.Status()
	e := &PermissionError{Code: st.Code, Identity: id.String(), Err: err}
	named := func(user string) { // the user the API's message names
		if u, _, ok := id.User(); user != "" && (!ok || u != user) {
			e.Identity = fmt.Sprintf("user %q", user)
		}
	}
	if d := st.Details; d != nil {
		e.Group, e.Resource = d.Group, d.Kind
	}
	switch {
	case apierrors.IsUnauthorized(err):
		e.Code = http.StatusUnauthorized
	case apierrors.IsForbidden(err):
		e.Code = http.StatusForbidden
		named(e.fromMessage(st.Message))
	case apierrors.IsInvalid(err):
		user, ok := e.fromCauses(st)
		if !ok {
			return nil
		}
		named(user)
		e.Code = http.StatusUnprocessableEntity
	default:
		return nil
	}
	md := map[string]string{errdefs.MetaVerb: e.Verb, errdefs.MetaResource: e.Resource, errdefs.MetaIdentity: e.Identity}
	if e.Group != "" {
		md[errdefs.MetaGroup] = e.Group
	}
	return errdefs.WithReason(e, errdefs.ReasonKubernetesAPIDenied, md)
}

// fromMessage reads the verb, resource and group of kube-apiserver's (or
// nodeplug-apiserver's) 403 message, and returns the user it names.
func (e *PermissionError) fromMessage(msg string) (user string) {
	m := forbiddenRE.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	e.Verb, e.Resource, e.Group = m[2], m[3], m[4]
	return m[1]
}

// fromCauses finds, among a 422's causes, a field the API forbids
// changing without a permission, reads the permission it names and
// returns the user it names (if any); ok is false when there is none.
func (e *PermissionError) fromCauses(st metav1.Status) (user string, ok bool) {
	if st.Details == nil {
		return "", false
	}
	for _, c := range st.Details.Causes {
		if c.Type != metav1.CauseTypeForbidden {
			continue
		}
		if m := requiresRE.FindStringSubmatch(c.Message); m != nil {
			e.Resource, e.Verb = m[1], m[2]
			if u := forbiddenRE.FindStringSubmatch(c.Message); u != nil {
				user = u[1]
			}
			return user, true
		}
	}
	return "", false
}
