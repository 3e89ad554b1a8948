package localapi

import (
	"context"
	"fmt"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// resources is one pool of this node with the named devices.
func resources(gen int64, devices ...string) *resourceslice.DriverResources {
	s := resourceslice.Slice{}
	for _, d := range devices {
		s.Devices = append(s.Devices, resourcev1.Device{Name: d})
	}
	return &resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{testNode: {Generation: gen, Slices: []resourceslice.Slice{s}}}}
}

// TestUpstreamSliceController runs the ResourceSlice controller of
// k8s.io/dynamic-resource-allocation — what the kubeletplugin helper
// publishes with — against the API with the driver's kubeconfig.
func TestUpstreamSliceController(t *testing.T) {
	root := testutil.TempDir(t)
	a := startAPI(t, root, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	drv := clientFor(t, root, Driver)
	node, err := drv.CoreV1().Nodes().Get(ctx, testNode, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := resourceslice.StartController(ctx, resourceslice.Options{
		DriverName: "gpu.example.com", KubeClient: drv,
		Owner:     &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID},
		Resources: resources(1, "gpu-0", "gpu-1"),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	waitDevices(t, a, 2)
	c.Update(resources(2, "gpu-0", "gpu-1", "gpu-2"))
	waitDevices(t, a, 3)
	list, _ := a.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if s := list.Items[0]; len(s.OwnerReferences) != 1 || s.OwnerReferences[0].UID != node.UID || nodeNameOfSlice(&s) != testNode {
		t.Fatalf("slice %+v: want it owned by the Node %s on %s", s.ObjectMeta, node.UID, testNode)
	}
	c.Update(&resourceslice.DriverResources{})
	waitDevices(t, a, -1)
}

func nodeNameOfSlice(s *resourcev1.ResourceSlice) string {
	if s.Spec.NodeName == nil {
		return ""
	}
	return *s.Spec.NodeName
}

// waitDevices waits for exactly one slice with n devices (n < 0: no slice).
func waitDevices(t *testing.T, a *api, n int) {
	t.Helper()
	testutil.Eventually(t, fmt.Sprintf("a slice with %d devices", n), func() error {
		list, err := a.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return err
		}
		if n < 0 && len(list.Items) == 0 {
			return nil
		}
		if n < 0 || len(list.Items) != 1 || len(list.Items[0].Spec.Devices) != n {
			return fmt.Errorf("%d slices: %v", len(list.Items), list.Items)
		}
		return nil
	})
}
