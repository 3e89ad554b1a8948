package podworker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/podworker"
)

// extendedPod asks for DRA extended resources: its init container for
// one device by the class's implicit name, its app container for two by
// the name class gpu-ext gives, and a CPU the node provides.
func extendedPod(ns, name string) *corev1.Pod {
	limits := func(kv ...string) corev1.ResourceList {
		l := corev1.ResourceList{}
		for i := 0; i < len(kv); i += 2 {
			l[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
		}
		return l
	}
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Image: "example.com/init:1",
			Resources: corev1.ResourceRequirements{Limits: limits(resourcev1.ResourceDeviceClassPrefix+"gpu", "1")}}},
		Containers: []corev1.Container{{Name: "app", Image: "example.com/app:1",
			Resources: corev1.ResourceRequirements{Limits: limits("example.com/gpu", "2", "cpu", "1")}}},
	}}
}

// TestPodDRAExtendedResources: a pod's DRA extended resources are
// allocated through one claim made for it as the scheduler makes it (its
// name, owner, annotation and one request per container and resource),
// named in the pod's status.extendedResourceClaimStatus with each
// container's request; the claim is prepared and each container gets the
// CDI devices of its requests; no field is reported unsupported. Deleting
// the pod unprepares and deletes the claim.
func TestPodDRAExtendedResources(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ext := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu-ext"}, Spec: resourcev1.DeviceClassSpec{
		ExtendedResourceName: ptr.To("example.com/gpu"),
		Selectors:            []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "` + gpu + `"`}}},
	}}
	if _, err := e.api.Client.ResourceV1().DeviceClasses().Create(ctx, ext, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(extendedPod("default", "trainer"))

	var p *corev1.Pod
	testutil.Eventually(t, "pod bound with its extended resources prepared", func() error {
		p = e.pod("default", "trainer")
		if c := scheduled(p); p.Spec.NodeName != dratest.Node || c == nil || c.Status != corev1.ConditionTrue {
			return fmt.Errorf("node %q, scheduled %+v", p.Spec.NodeName, c)
		}
		return nil
	})
	st := p.Status.ExtendedResourceClaimStatus
	if st == nil {
		t.Fatal("no status.extendedResourceClaimStatus")
	}
	want := []corev1.ContainerExtendedResourceRequest{
		{ContainerName: "init", ResourceName: resourcev1.ResourceDeviceClassPrefix + "gpu", RequestName: "container-0-request-0"},
		{ContainerName: "app", ResourceName: "example.com/gpu", RequestName: "container-1-request-0"},
	}
	if fmt.Sprint(st.RequestMappings) != fmt.Sprint(want) {
		t.Errorf("request mappings %+v, want %+v", st.RequestMappings, want)
	}
	if !strings.HasPrefix(st.ResourceClaimName, "trainer-extended-resources-") {
		t.Errorf("claim %q, want trainer-extended-resources-<suffix>", st.ResourceClaimName)
	}
	c, err := e.claim("default", st.ResourceClaimName)
	if err != nil {
		t.Fatal(err)
	}
	if c.Annotations[resourcev1.ExtendedResourceClaimAnnotation] != "true" || len(c.OwnerReferences) != 1 ||
		c.OwnerReferences[0].UID != p.UID || !ptr.Deref(c.OwnerReferences[0].Controller, false) {
		t.Errorf("claim meta %+v", c.ObjectMeta)
	}
	reqs := c.Spec.Devices.Requests
	if len(reqs) != 2 || reqs[0].Exactly == nil || reqs[0].Exactly.DeviceClassName != "gpu" || reqs[0].Exactly.Count != 1 ||
		reqs[1].Exactly == nil || reqs[1].Exactly.DeviceClassName != "gpu-ext" || reqs[1].Exactly.Count != 2 ||
		reqs[1].Exactly.AllocationMode != resourcev1.DeviceAllocationModeExactCount {
		t.Errorf("claim requests %+v", reqs)
	}
	if c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 3 {
		t.Fatalf("claim allocation %+v", c.Status.Allocation)
	}
	if prepared, _ := e.plugin.Calls(c.UID); prepared == 0 {
		t.Error("the claim was not prepared by its driver")
	}
	var ev map[string]string
	testutil.Eventually(t, "prepared event", func() error {
		if ev = e.events("default", "trainer"); ev[podworker.ReasonPrepared] == "" {
			return fmt.Errorf("events %v", ev)
		}
		return nil
	})
	// One CDI device per allocated device of the container's request.
	m := ev[podworker.ReasonPrepared]
	if got := cdiDevicesIn(m, "init"); len(got) != 1 {
		t.Errorf("prepared event gives init %q, want 1 CDI device: %s", got, m)
	}
	if got := cdiDevicesIn(m, "app"); len(got) != 2 {
		t.Errorf("prepared event gives app %q, want 2 CDI devices: %s", got, m)
	}
	if u := ev[podworker.ReasonUnsupportedField]; u != "" {
		t.Errorf("DRA extended resources reported unsupported: %s", u)
	}

	if err := e.api.Client.CoreV1().Pods("default").Delete(ctx, "trainer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "claim unprepared and deleted", func() error {
		if _, err := e.claim("default", c.Name); !apierrors.IsNotFound(err) {
			return fmt.Errorf("claim %s: %v", c.Name, err)
		}
		if _, unprepared := e.plugin.Calls(c.UID); unprepared == 0 {
			return errors.New("claim deleted before it was unprepared")
		}
		return nil
	})
}

// TestPodDRAExtendedResourcesUnsatisfiable: a pod naming the implicit
// resource of a class that does not exist, and one asking for more
// devices than the node has, stay Pending, unbound, with a
// FailedScheduling warning giving the reason.
func TestPodDRAExtendedResourcesUnsatisfiable(t *testing.T) {
	e := newEnv(t)
	missing := extendedPod("default", "missing")
	missing.Spec.InitContainers = nil
	missing.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(resourcev1.ResourceDeviceClassPrefix + "tpu"): resource.MustParse("1")}
	tooMany := extendedPod("default", "too-many")
	tooMany.Spec.InitContainers = nil
	tooMany.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceName(resourcev1.ResourceDeviceClassPrefix + "gpu"): resource.MustParse("5")}
	e.create(missing, tooMany)
	for name, reason := range map[string]string{"missing": "there is no DeviceClass tpu", "too-many": "cannot be allocated"} {
		testutil.Eventually(t, name+" unschedulable", func() error {
			p := e.pod("default", name)
			c := scheduled(p)
			if c == nil || c.Status != corev1.ConditionFalse || c.Reason != corev1.PodReasonUnschedulable || !strings.Contains(c.Message, reason) {
				return fmt.Errorf("scheduled %+v", c)
			}
			if ev := e.events("default", name); !strings.Contains(ev[podworker.ReasonFailedScheduling], reason) {
				return fmt.Errorf("events %v", ev)
			}
			if p.Spec.NodeName != "" || p.Status.Phase != corev1.PodPending {
				return fmt.Errorf("node %q phase %s", p.Spec.NodeName, p.Status.Phase)
			}
			return nil
		})
	}
}

// cdiDevicesIn are the CDI devices a PreparedDynamicResources message
// names for container ("…; <container>: a, b; …"); none when it names
// none.
func cdiDevicesIn(message, container string) []string {
	for _, part := range strings.Split(message, "; ") {
		if _, devs, ok := strings.Cut(part, container+": "); ok && devs != "" {
			return strings.Split(devs, ", ")
		}
	}
	return nil
}
