package claimview

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/apiserver/apiservertest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
)

// TestRefusedListIsPermissionDenied: a List the API refuses (the
// node-local API's drivers' role may not list claims) is PERMISSION_DENIED
// naming the verb, the resource and the identity, not UNAVAILABLE: asking
// again will not help.
func TestRefusedListIsPermissionDenied(t *testing.T) {
	root := testutil.TempDir(t)
	api := apiservertest.Start(t, root, "node-1")
	v := New(api.ClientFor(t, layout.KubeconfigFile(root)), "node-1", nil, nil, WithIdentity(kubeaccess.KnownIdentity("nodeplug-driver")))
	_, err := v.List(context.Background(), ListOptions{})
	var pe *kubeaccess.PermissionError
	if !errors.Is(err, errdefs.ErrPermissionDenied) || errors.Is(err, errdefs.ErrUnavailable) || !errors.As(err, &pe) {
		t.Fatalf("List as the driver: %v, want PERMISSION_DENIED alone", err)
	}
	if pe.Verb != "list" || pe.Resource != "resourceclaims" || pe.Identity != `user "nodeplug-driver"` {
		t.Errorf("refused %s %s to %s; want list resourceclaims to user \"nodeplug-driver\"", pe.Verb, pe.Resource, pe.Identity)
	}
	if st := status.Convert(errdefs.ToGRPC(err)); st.Code() != codes.PermissionDenied {
		t.Errorf("as a status: %v %q, want PermissionDenied", st.Code(), st.Message())
	}
}
