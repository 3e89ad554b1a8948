package kubeaccess

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

var claimKind = schema.GroupKind{Group: resourcev1.GroupName, Kind: "ResourceClaim"}

// bindingRefused is kube-apiserver's 422 for a status write without
// update on resourceclaims/binding (pkg/registry/resource:
// AuthorizedForBinding, its forbidden reason as responsewriters writes it).
func bindingRefused(user string) error {
	return apierrors.NewInvalid(claimKind, "train", field.ErrorList{
		field.Forbidden(field.NewPath("status", "allocation"), fmt.Sprintf(
			`changing status.allocation or status.reservedFor requires resource="resourceclaims/binding", verb="update" permission: `+
				`resourceclaims.resource.k8s.io is forbidden: User %q cannot update resource "resourceclaims/binding" in API group "resource.k8s.io" at the cluster scope`, user)),
	})
}

// forbidden is kube-apiserver's 403 (responsewriters.ForbiddenStatusError).
func forbidden(user, verb, resource, ns string) error {
	return apierrors.NewForbidden(resourcev1.Resource("resourceclaims"), "train", fmt.Errorf(
		"User %q cannot %s resource %q in API group %q in the namespace %q", user, verb, resource, "resource.k8s.io", ns))
}

// TestDenied: each permission error of the API (403, 401, the 422 of a
// field the API forbids without resourceclaims/binding), as apimachinery
// builds it, is PERMISSION_DENIED naming the verb, the resource and the
// identity refused; every other error is left alone.
func TestDenied(t *testing.T) {
	me := KnownIdentity("nodeplug-dramanager:node-1", "nodeplug:dramanagers", "system:authenticated")
	meText := `user "nodeplug-dramanager:node-1" (groups nodeplug:dramanagers, system:authenticated)`
	for _, tc := range []struct {
		name     string
		err      error
		id       *Identity
		code     int32
		verb     string
		resource string
		who      string // the identity named
	}{
		{name: "403 of kube-apiserver", err: forbidden("nodeplug-dramanager:node-1", "update", "resourceclaims", "default"), id: me,
			code: 403, verb: "update", resource: "resourceclaims", who: meText},
		{name: "403 naming another user", err: forbidden("system:anonymous", "get", "resourceclaims/status", "default"), id: me,
			code: 403, verb: "get", resource: "resourceclaims/status", who: `user "system:anonymous"`},
		{name: "403 of another shape", err: apierrors.NewForbidden(resourcev1.Resource("resourceslices"), "", errors.New("no")), id: me,
			code: 403, resource: "resourceslices", who: meText},
		{name: "422 without resourceclaims/binding", err: bindingRefused("nodeplug-dramanager:node-1"), id: me,
			code: 422, verb: "update", resource: "resourceclaims/binding", who: meText},
		{name: "422, identity not known", err: bindingRefused(""), id: unknownIdentity("the SelfSubjectReview failed: unreachable"),
			code: 422, verb: "update", resource: "resourceclaims/binding", who: "an identity not known (the SelfSubjectReview failed: unreachable)"},
		{name: "401", err: apierrors.NewUnauthorized("Unauthorized"), id: me, code: 401, who: meText},
		{name: "401 wrapped, nil identity", err: fmt.Errorf("reading: %w", apierrors.NewUnauthorized("")), code: 401, who: "an identity not known"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			denied := Denied(tc.err, tc.id)
			var pe *PermissionError
			if !errors.As(denied, &pe) {
				t.Fatalf("Denied(%v) = %v, want a *PermissionError", tc.err, denied)
			}
			if pe.Code != tc.code || pe.Verb != tc.verb || pe.Resource != tc.resource || pe.Identity != tc.who {
				t.Errorf("refused %d %q %q to %q; want %d %q %q to %q", pe.Code, pe.Verb, pe.Resource, pe.Identity, tc.code, tc.verb, tc.resource, tc.who)
			}
			if !errors.Is(denied, errdefs.ErrPermissionDenied) || !errors.Is(denied, tc.err) && !errors.Is(denied, errors.Unwrap(tc.err)) {
				t.Errorf("%v does not wrap ErrPermissionDenied and the API's error", denied)
			}
			msg := denied.Error()
			for _, part := range []string{tc.verb, tc.resource, tc.who, "permission denied"} {
				if !strings.Contains(msg, part) {
					t.Errorf("message %q does not name %q", msg, part)
				}
			}
			if tc.code != 401 && !strings.Contains(msg, Manifest) {
				t.Errorf("message %q does not say where the permissions are granted (%s)", msg, Manifest)
			}
			st := status.Convert(errdefs.ToGRPC(fmt.Errorf("reserving claim default/train: %w", denied)))
			if st.Code() != codes.PermissionDenied {
				t.Errorf("code %v, want PermissionDenied", st.Code())
			}
			info, ok := errdefs.InfoOf(st.Err())
			if !ok || info.GetReason() != errdefs.ReasonKubernetesAPIDenied ||
				info.GetMetadata()[errdefs.MetaVerb] != tc.verb || info.GetMetadata()[errdefs.MetaResource] != tc.resource ||
				info.GetMetadata()[errdefs.MetaIdentity] != tc.who {
				t.Errorf("ErrorInfo %v, want reason %s naming %q %q %q", info, errdefs.ReasonKubernetesAPIDenied, tc.verb, tc.resource, tc.who)
			}
		})
	}
	for _, err := range []error{
		nil,
		errors.New("connection refused"),
		apierrors.NewNotFound(resourcev1.Resource("resourceclaims"), "train"),
		apierrors.NewConflict(resourcev1.Resource("resourceclaims"), "train", errors.New("changed")),
		apierrors.NewInternalError(errors.New("etcd")),
		apierrors.NewInvalid(claimKind, "train", field.ErrorList{
			field.Forbidden(field.NewPath("status", "allocation", "devices", "results").Index(0).Child("adminAccess"),
				"admin access to devices requires the `resource.kubernetes.io/admin-access: true` label on the containing namespace"),
		}),
		apierrors.NewInvalid(claimKind, "train", field.ErrorList{field.Required(field.NewPath("spec"), "")}),
	} {
		if d := Denied(err, me); d != nil {
			t.Errorf("Denied(%v) = %v, want nil: not a permission refused", err, d)
		}
	}
}

// TestIdentityString: known, not known with why, nil.
func TestIdentityString(t *testing.T) {
	for _, tc := range []struct {
		id   *Identity
		want string
	}{
		{KnownIdentity("u"), `user "u"`},
		{KnownIdentity("u", "g1", "g2"), `user "u" (groups g1, g2)`},
		{unknownIdentity("not asked yet"), "an identity not known (not asked yet)"},
		{nil, "an identity not known"},
	} {
		if got := tc.id.String(); got != tc.want {
			t.Errorf("%q, want %q", got, tc.want)
		}
	}
}
