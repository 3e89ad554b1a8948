package slicewatch_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubecache"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/slicewatch"
)

// An API that refuses the list of slices makes List, and a Watch that
// waited in vain for the informer's first list, PERMISSION_DENIED naming
// the verb, the resource and the identity refused (not UNAVAILABLE, as
// if the API did not answer).
func TestRefusedListIsPermissionDenied(t *testing.T) {
	old := slicewatch.SyncWait
	slicewatch.SyncWait = 200 * time.Millisecond
	t.Cleanup(func() { slicewatch.SyncWait = old })
	client := fake.NewClientset()
	client.PrependReactor("list", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(resourcev1.Resource("resourceslices"), "", errors.New(
			`User "nodeplug-dramanager:node-1" cannot list resource "resourceslices" in API group "resource.k8s.io" at the cluster scope`))
	})
	kc, err := kubecache.New(client, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	s := slicewatch.New(kc.NodeSlices, client, "node-1", stream.Limits{}, nil)
	s.Explain(kubeaccess.KnownIdentity("nodeplug-dramanager:node-1", "nodeplug:dramanagers"), func() error { return kc.LastError(kc.NodeSlices) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = kc.Run(ctx); done <- struct{}{} }()
	go func() { _ = s.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	testutil.WaitFor(t, "the informer's list refused", func() bool { return kc.LastError(kc.NodeSlices) != nil })

	_, listErr := s.List(ctx, "")
	_, _, watchErr := s.Watch(ctx, "")
	for name, err := range map[string]error{"List": listErr, "Watch": watchErr} {
		if !errors.Is(err, errdefs.ErrPermissionDenied) || errdefs.Code(err).String() != "PermissionDenied" {
			t.Errorf("%s: %v, want PERMISSION_DENIED", name, err)
			continue
		}
		for _, want := range []string{"refused list on resourceslices (resource.k8s.io)", `"nodeplug-dramanager:node-1" (groups nodeplug:dramanagers)`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %q does not say %q", name, err, want)
			}
		}
	}
}
