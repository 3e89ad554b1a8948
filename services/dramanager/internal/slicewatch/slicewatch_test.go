package slicewatch_test

import (
	"context"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/kubecache"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/slicewatch"
)

func slice(name, driver, node string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourcev1.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node), Pool: resourcev1.ResourcePool{Name: name, ResourceSliceCount: 1}},
	}
}

// Count knows nothing until the informer has listed, then counts this
// node's slices of a driver, following creations and deletions.
func TestCountFollowsThisNodesSlices(t *testing.T) {
	// client-go's fake ignores field selectors: which node's slices the
	// informer holds is the API's to decide, and tested with the real one.
	client := fake.NewClientset(slice("a1", "a.example.com", "node-1"), slice("a2", "a.example.com", "node-1"),
		slice("b1", "b.example.com", "node-1"))
	kc, err := kubecache.New(client, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	s := slicewatch.New(kc.NodeSlices, client, "node-1", stream.Limits{}, nil)
	if _, ok := s.Count("a.example.com"); ok {
		t.Fatal("Count says it knows before the informer listed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = kc.Run(ctx); done <- struct{}{} }()
	go func() { _ = s.Run(ctx); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })

	count := func(driver string, want int) {
		t.Helper()
		testutil.WaitFor(t, driver+" counted", func() bool {
			n, ok := s.Count(driver)
			return ok && n == want
		})
	}
	count("a.example.com", 2)
	count("b.example.com", 1)
	count("c.example.com", 0)
	if err := client.ResourceV1().ResourceSlices().Delete(ctx, "a1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ResourceV1().ResourceSlices().Create(ctx, slice("c1", "c.example.com", "node-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	count("a.example.com", 1)
	count("c.example.com", 1)
}
