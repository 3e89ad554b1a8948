package drivers_test

import (
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubeaccess"
)

// A deletion the API refuses for want of deletecollection is logged
// naming the permission and the identity refused, and tried again past
// the backoff's cap (it used to give up there): once the permission is
// granted, the slices go.
func TestRefusedDeletionIsRetriedUntilGranted(t *testing.T) {
	drivers.SetWipeBackoff(t, wait.Backoff{Duration: time.Millisecond, Factor: 2, Cap: 4 * time.Millisecond, Steps: 100})
	slice := nodeSlice("gone.example.com")
	client := fake.NewClientset(slice)
	var mu sync.Mutex
	refusals := 0
	const refused = 20 // well past the cap
	client.PrependReactor("delete-collection", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		if refusals < refused {
			refusals++
			return true, nil, apierrors.NewForbidden(resourceapi.Resource("resourceslices"), "", errors.New(
				`User "nodeplug-dramanager:node-1" cannot deletecollection resource "resourceslices" in API group "resource.k8s.io" at the cluster scope`))
		}
		return true, nil, nil
	})
	var out syncBuffer
	reg := prometheus.NewRegistry()
	r, err := drivers.New(drivers.Config{
		Client: client, NodeName: "node-1", AllowedDirs: []string{testutil.TempDir(t)}, DisconnectDelay: 10 * time.Millisecond,
		Identity: kubeaccess.KnownIdentity("nodeplug-dramanager:node-1", "nodeplug:dramanagers"),
		Log:      slog.New(slog.NewTextHandler(&out, nil)), Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	r.Start()
	testutil.WaitFor(t, "the slices deleted once the API allows it", func() bool {
		return deletions(t, reg, "gone.example.com", "absent") == 1
	})
	log := out.String()
	for _, want := range []string{"refused deletecollection on resourceslices (resource.k8s.io)", `nodeplug-dramanager:node-1`, "nodeplug:dramanagers", "permission denied"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log does not say %q:\n%s", want, log)
		}
	}
}
