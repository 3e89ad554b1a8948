package claimalloc

import (
	"context"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
)

// TestRefusalIsPermissionDenied: an Allocator whose identity the API
// (the node-local one, with its own roles) refuses a call gets
// PERMISSION_DENIED naming the verb, the resource and the user refused,
// whether the refusal is of the claim's marker (the reader may not
// update claims) or of a read (the drivers' role may not list claims).
func TestRefusalIsPermissionDenied(t *testing.T) {
	root := testutil.TempDir(t)
	api := startAPI(t, root)
	e := &env{t: t, client: api.Client}
	e.slice(gpu, testNode, "a", "gpu-0")
	e.class(gpu, gpu)
	ref := e.claim("c", req("gpu", gpu, 1))
	for _, tc := range []struct {
		identity   string // the kubeconfig's
		user       string
		verb, what string
	}{
		{identity: "reader", user: "nodeplug-reader", verb: "update", what: "resourceclaims"},
		{identity: "", user: "nodeplug-driver", verb: "list", what: "resourceclaims"},
	} {
		t.Run(tc.user, func(t *testing.T) {
			path := layout.KubeconfigFile(root)
			if tc.identity != "" {
				path = layout.IdentityKubeconfigFile(root, tc.identity)
			}
			client := api.ClientFor(t, path)
			al, err := New(client, testNode, nil)
			if err != nil {
				t.Fatal(err)
			}
			al.SetIdentity(kubeaccess.KnownIdentity(tc.user))
			_, err = al.Reserve(context.Background(), pod("p"), ref)
			var pe *kubeaccess.PermissionError
			if !errors.Is(err, errdefs.ErrPermissionDenied) || !errors.As(err, &pe) {
				t.Fatalf("Reserve as %s: %v, want PERMISSION_DENIED", tc.user, err)
			}
			if pe.Code != 403 || pe.Verb != tc.verb || pe.Resource != tc.what || pe.Identity != `user "`+tc.user+`"` {
				t.Errorf("refused %d %s %s to %s; want 403 %s %s to user %q", pe.Code, pe.Verb, pe.Resource, pe.Identity, tc.verb, tc.what, tc.user)
			}
			if st := status.Convert(errdefs.ToGRPC(err)); st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), tc.verb+" on "+tc.what) {
				t.Errorf("as a status: %v %q, want PermissionDenied naming %s on %s", st.Code(), st.Message(), tc.verb, tc.what)
			}
		})
	}
	if c := e.get(ref); c.Status.Allocation != nil || c.Annotations[AllocatedByAnnotation] != "" {
		t.Errorf("the refused reservations left %+v %v", c.Status.Allocation, c.Annotations)
	}
}
