package upstream

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
	"k8s.io/kubernetes/pkg/kubelet/apis/podresources"

	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// TestPodInitContainerDevicesReused: as the kubelet's device manager
// reuses an init container's devices for the app containers (init
// containers run to their end before them), a node with exactly N devices
// takes a pod whose init container asks for N and whose app container
// asks for N: the pod is bound, its app container got the init
// container's devices, the devices are counted allocated once, the pod
// resources API lists them under the app container alone (the kubelet
// lists no init container that runs to its end), and deleting the pod
// frees them all.
func TestPodInitContainerDevicesReused(t *testing.T) {
	buildCtrBins(t)
	n := startDRANode(t, longDelay)
	const res, devices = "example.com/sample", 2
	n.startSamplePlugin(res, devices)
	cs := n.operator()
	manifest := filepath.Join(n.root, "pod.yaml")
	writeFile(t, manifest, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: reuse
spec:
  initContainers:
  - name: setup
    image: registry.example.com/setup:1.0
    resources:
      limits:
        %[1]s: %[2]d
  containers:
  - name: main
    image: registry.example.com/app:1.0
    resources:
      limits:
        %[1]s: %[2]d
`, res, devices))
	n.ctl("apply", "-f", manifest)

	var pod *corev1.Pod
	var shared []string
	testutil.Eventually(t, "pod reuse bound, its app container with the init container's devices", func() (err error) {
		if pod, err = cs.CoreV1().Pods("default").Get(ctxT(t), "reuse", metav1.GetOptions{}); err != nil {
			return err
		}
		if pod.Spec.NodeName == "" {
			return fmt.Errorf("not bound: %v", pod.Status.Conditions)
		}
		got := map[string]*dmv1.Allocation{}
		for _, a := range n.allocations(string(pod.UID)) {
			got[a.GetContainerName()] = a
		}
		setup, main := got["setup"], got["main"]
		if len(got) != 2 || setup == nil || main == nil {
			return fmt.Errorf("allocations %v", got)
		}
		if setup.GetContainerKind() != dmv1.ContainerKind_CONTAINER_KIND_INIT || main.GetContainerKind() != dmv1.ContainerKind_CONTAINER_KIND_APP {
			return fmt.Errorf("kinds: setup %v, main %v", setup.GetContainerKind(), main.GetContainerKind())
		}
		if len(setup.GetDeviceIds()) != devices || !slices.Equal(main.GetDeviceIds(), setup.GetDeviceIds()) {
			return fmt.Errorf("setup got %v, main got %v", setup.GetDeviceIds(), main.GetDeviceIds())
		}
		shared = main.GetDeviceIds()
		return nil
	})
	if r := n.resourceOf(res); r.GetFree() != 0 || !slices.Equal(r.GetAllocatedDeviceIds(), shared) {
		t.Fatalf("resource %v; want no device free and %v allocated once each", r, shared)
	}

	sock := filepath.Join(n.root, "pod-resources", "kubelet.sock")
	prc, conn, err := podresources.GetV1Client(ctxT(t), "unix://"+sock, 0, podResourcesMaxMsgSize)
	if err != nil {
		t.Fatalf("GetV1Client %s: %v", sock, err)
	}
	defer func() { _ = conn.Close() }()
	got, err := prc.Get(ctxT(t), &podresourcesv1.GetPodResourcesRequest{PodName: "reuse", PodNamespace: "default"})
	if err != nil {
		t.Fatalf("pod resources Get default/reuse: %v", err)
	}
	var listed []string
	for _, c := range got.GetPodResources().GetContainers() {
		for _, d := range c.GetDevices() {
			for _, id := range d.GetDeviceIds() {
				listed = append(listed, c.GetName()+"="+id)
			}
		}
	}
	var want []string
	for _, id := range shared {
		want = append(want, "main="+id)
	}
	if !slices.Equal(listed, want) {
		t.Fatalf("pod resources lists %v, want %v", listed, want)
	}

	n.ctl("delete", "pod", "reuse")
	testutil.Eventually(t, "the deleted pod's devices freed", func() error {
		if a := n.allocations(string(pod.UID)); len(a) != 0 {
			return fmt.Errorf("allocations %v", a)
		}
		if r := n.resourceOf(res); r.GetFree() != devices || len(r.GetAllocatedDeviceIds()) != 0 {
			return fmt.Errorf("resource %v", r)
		}
		return nil
	})
}

// resourceOf returns the devicemanager's view of resource.
func (n *draNode) resourceOf(resource string) *dmv1.Resource {
	n.t.Helper()
	resp, err := n.dmClient().ListResources(ctxT(n.t), &dmv1.ListResourcesRequest{})
	if err != nil {
		n.t.Fatalf("ListResources: %v", err)
	}
	for _, r := range resp.GetResources() {
		if r.GetName() == resource {
			return r
		}
	}
	n.t.Fatalf("no resource %s in %v", resource, resp.GetResources())
	return nil
}
