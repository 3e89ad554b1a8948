package drivers_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
)

// The deletion itself, against client-go's fake clientset (its tracker
// ignores field selectors, so only the request is checked here; the real
// API's answer is in the other tests): one DeleteCollection per driver
// with the kubelet's field selector, retried when the API refuses it.
func TestDeletionSelectorAndRetry(t *testing.T) {
	slice := nodeSlice("gone.example.com")
	client := fake.NewClientset(slice)
	var mu sync.Mutex
	var selectors []string
	client.PrependReactor("delete-collection", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		selectors = append(selectors, a.(k8stesting.DeleteCollectionAction).GetListRestrictions().Fields.String())
		if len(selectors) == 1 {
			return true, nil, apierrors.NewInternalError(errors.New("store unavailable"))
		}
		return true, nil, nil
	})
	r, err := drivers.New(drivers.Config{Client: client, NodeName: "node-1", AllowedDirs: []string{testutil.TempDir(t)}, DisconnectDelay: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	r.Start()
	testutil.WaitFor(t, "the deletion retried after the API refused it", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(selectors) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	for _, s := range selectors {
		if s != "spec.driver=gone.example.com,spec.nodeName=node-1" {
			t.Errorf("field selector %q", s)
		}
	}
	if a := client.Actions(); len(a) == 0 || a[0].GetVerb() != "list" || a[0].GetResource() != (schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceslices"}) {
		t.Errorf("first action %v, want the list of this node's slices", a)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	if _, err := drivers.New(drivers.Config{Client: fake.NewClientset(), AllowedDirs: []string{"/tmp"}}); err == nil {
		t.Error("a client without a node name was accepted")
	}
	if _, err := drivers.New(drivers.Config{}); err == nil {
		t.Error("no allowed directories was accepted")
	}
}

// With a cache of this node's slices (Config.Slices), a driver the cache
// holds no slice of costs the API nothing when it is wiped; one it holds
// slices of is deleted with one DeleteCollection, counted from the cache
// without a List. A cache that has not listed yet leaves the List in.
func TestDeletionTrustsTheListedCache(t *testing.T) {
	var mu sync.Mutex
	counts := map[string]int{"none.example.com": 0, "three.example.com": 3}
	synced := true
	slicesOf := func(driver string) (int, bool) {
		mu.Lock()
		defer mu.Unlock()
		return counts[driver], synced
	}
	for _, tc := range []struct {
		driver string
		synced bool
		verbs  []string
	}{
		{driver: "none.example.com", synced: true, verbs: nil},
		{driver: "three.example.com", synced: true, verbs: []string{"delete-collection"}},
		{driver: "none.example.com", synced: false, verbs: []string{"list", "delete-collection"}},
	} {
		t.Run(fmt.Sprintf("%s/synced=%v", tc.driver, tc.synced), func(t *testing.T) {
			mu.Lock()
			synced = tc.synced
			mu.Unlock()
			slice := nodeSlice(tc.driver)
			client := fake.NewClientset(slice)
			reg := prometheus.NewRegistry()
			r, err := drivers.New(drivers.Config{
				Client: client, NodeName: "node-1", AllowedDirs: []string{testutil.TempDir(t)},
				DisconnectDelay: 10 * time.Millisecond, Registerer: reg, Slices: slicesOf,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Close)
			r.Start() // the start sweep lists the node's slices, then wipes tc.driver's
			testutil.WaitFor(t, "the wipe of "+tc.driver+" counted", func() bool {
				return deletions(t, reg, tc.driver, "absent") == 1
			})
			a := client.Actions()
			if len(a) == 0 || a[0].GetVerb() != "list" {
				t.Fatalf("API calls %v: the start's list of the node's slices is not first", a)
			}
			var verbs []string
			for _, x := range a[1:] {
				verbs = append(verbs, x.GetVerb())
			}
			if !slices.Equal(verbs, tc.verbs) {
				t.Errorf("API calls of the wipe: %q, want %q", verbs, tc.verbs)
			}
		})
	}
}

// nodeSlice is a ResourceSlice of driver on node-1, for the fake clientset.
func nodeSlice(driver string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "s1"},
		Spec:       resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To("node-1"), Pool: resourceapi.ResourcePool{Name: "p", ResourceSliceCount: 1}},
	}
}
