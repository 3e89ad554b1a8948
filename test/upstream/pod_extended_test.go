package upstream

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// TestDRAExtendedResourcesInPodman: a pod asking for devices by extended
// resource names, as a cluster with DRA extended resources takes them.
// Its init container names a class's implicit resource
// (deviceclass.resource.kubernetes.io/<class>), its app container the
// extendedResourceName of another class, and the name of a third class
// that the sample device plugin also serves: the device plugin's wins.
// The pod runs in podman: each container sees the driver's CDI edits for
// its own request (its class's config), the app container also the
// plugin's device; the pod's status maps each DRA-backed resource to its
// request in the claim made for it; the claim is released and deleted
// when the pod ends, and deleting the pod removes its containers.
func TestDRAExtendedResourcesInPodman(t *testing.T) {
	const driverName = "extended.test.nodeplug.io"
	devs := []resourcev1.Device{gpu("gpu-0", "a100", 0, "40Gi"), gpu("gpu-1", "a100", 1, "40Gi")}
	n, _, pm, cs := podmanNodeWith(t, driverName, devs)
	n.waitSlices(cs, driverName, devs)
	hostDir := testutil.TempDir(t)
	hostDevices(t, hostDir)
	n.startSamplePlugin("example.com/sample", 1, "--mount-host-dir", hostDir)
	class := func(name, extended, who string) string {
		s := fmt.Sprintf(`---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: %s
spec:
  selectors:
  - cel:
      expression: device.driver == "%s"
  config:
  - opaque:
      driver: %[2]s
      parameters:
        who: %s
`, name, driverName, who)
		if extended != "" {
			s += "  extendedResourceName: " + extended + "\n"
		}
		return s
	}
	manifest := filepath.Join(n.root, "pod.yaml")
	writeFile(t, manifest, class("gpu-implicit", "", "implicit")+class("gpu-explicit", "example.com/gpu", "explicit")+
		class("sample-shadow", "example.com/sample", "shadow")+fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata:
  name: trainer
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: init
    image: %[1]s
    command: ["/ctrprobe", "-env", "admin_who", "-env", "NODEPLUG_DEVICES"]
    resources:
      limits:
        deviceclass.resource.kubernetes.io/gpu-implicit: 1
  containers:
  - name: main
    image: %[1]s
    command: ["/ctrprobe", "-env", "admin_who", "-env", "NODEPLUG_DEVICES"]
    resources:
      limits:
        example.com/gpu: 1
        example.com/sample: 1
`, podImage))
	t.Logf("$ nodeplugctl apply -f pod.yaml\n%s", n.ctl("apply", "-f", manifest))

	var pod *corev1.Pod
	testutil.Eventually(t, "pod trainer Succeeded", func() (err error) {
		if pod, err = cs.CoreV1().Pods("default").Get(ctxT(t), "trainer", metav1.GetOptions{}); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodSucceeded {
			return fmt.Errorf("phase %s, conditions %v, init %v, containers %v", pod.Status.Phase, pod.Status.Conditions,
				states(pod.Status.InitContainerStatuses), states(pod.Status.ContainerStatuses))
		}
		return nil
	})
	st := pod.Status.ExtendedResourceClaimStatus
	if st == nil || len(st.RequestMappings) != 2 ||
		st.RequestMappings[0] != (corev1.ContainerExtendedResourceRequest{ContainerName: "init", ResourceName: "deviceclass.resource.kubernetes.io/gpu-implicit", RequestName: "container-0-request-0"}) ||
		st.RequestMappings[1] != (corev1.ContainerExtendedResourceRequest{ContainerName: "main", ResourceName: "example.com/gpu", RequestName: "container-1-request-0"}) {
		t.Fatalf("status.extendedResourceClaimStatus %+v: want init's implicit and main's example.com/gpu, not the device plugin's example.com/sample", st)
	}
	for _, c := range []struct{ container, who, devices string }{{"init", "implicit", ""}, {"main", "explicit", "dev-0"}} {
		out := n.ctl("logs", "trainer", "-c", c.container)
		var r probeReport
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("nodeplugctl logs trainer -c %s: %v\n%s", c.container, err, out)
		}
		if v := r.Env["admin_who"]; v == nil || *v != c.who {
			t.Errorf("admin_who in container %s: %v, want %q (its own request's class config)", c.container, ptrVal(v), c.who)
		}
		got := ptrVal(r.Env["NODEPLUG_DEVICES"])
		if (c.devices == "" && got != nil) || (c.devices != "" && got != c.devices) {
			t.Errorf("NODEPLUG_DEVICES in container %s: %v, want %q (the sample plugin's device, for main only)", c.container, got, c.devices)
		}
	}
	t.Logf("$ nodeplugctl pods\n%s", n.ctl("pods"))
	testutil.Eventually(t, "the ended pod's claim and devices released", func() error {
		if _, err := cs.ResourceV1().ResourceClaims("default").Get(ctxT(t), st.ResourceClaimName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: %v", st.ResourceClaimName, err)
		}
		if a := n.allocations(string(pod.UID)); len(a) != 0 {
			return fmt.Errorf("devices still allocated: %v", a)
		}
		return nil
	})
	n.ctl("delete", "pod", "trainer")
	testutil.Eventually(t, "the deleted pod's containers removed", func() error { return pm.gone(string(pod.UID)) })
}
