package state

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/podinfo"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// snapPod returns the pod namespace/name of snap, or nil.
func snapPod(snap Snapshot, namespace, name string) *corev1.Pod {
	i := slices.IndexFunc(snap.Pods, func(p *corev1.Pod) bool { return p.Namespace == namespace && p.Name == name })
	if i < 0 {
		return nil
	}
	return snap.Pods[i]
}

// snapReasons returns the reasons of the events about the pod p, in the
// snapshot's order.
func snapReasons(snap Snapshot, p *corev1.Pod) []string {
	var out []string
	for _, e := range snap.Events {
		if e.InvolvedObject.Namespace == p.Namespace && e.InvolvedObject.Name == p.Name && e.InvolvedObject.UID == p.UID {
			out = append(out, e.Reason)
		}
	}
	return out
}

// TestFollowsPods runs the whole stack (no container runtime) with the
// sample device plugin and follows the node-local API with the reader's
// kubeconfig, as the console does: a pod whose device-plugin limit fits
// shows bound, its containers waiting with NoContainerRuntime, its
// devices among the allocations by its UID, its events Scheduled first;
// a pod asking for more devices than there are shows Pending with an
// UnexpectedAdmissionError event; a pod's claim made from a template
// shows in its status and among the dramanager's claims; after a kill -9
// and a restart of nodeplug-apiserver the API's status says it went down
// and synced again, and a pod deleted after the restart goes from the
// state with its allocation.
func TestFollowsPods(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the stack")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	bin := testutil.TempDir(t)
	names := []string{"nodeplug-sampleplugin"}
	for _, s := range stack.Services {
		names = append(names, "nodeplug-"+s)
	}
	if err := stack.Build(ctx, bin, names...); err != nil {
		t.Fatal(err)
	}
	root := testutil.TempDir(t)
	ps := stack.NewProcesses(bin, root)
	t.Cleanup(func() {
		ps.StopAll()
		for _, name := range stack.Services {
			if p := ps.Process(name); t.Failed() && p != nil {
				t.Logf("%s log:\n%s", name, p.Logs())
			}
		}
	})
	if err := ps.StartAll(ctx); err != nil {
		t.Fatal(err)
	}
	const res = "example.com/sample"
	plugin, err := stack.Start(filepath.Join(bin, "nodeplug-sampleplugin"),
		[]string{"--root-dir", root, "--mode", "plugins-registry", "--resource", res, "--devices", "2"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plugin.Stop(10 * time.Second) })

	conns := Conns{Kubeconfig: layout.IdentityKubeconfigFile(root, "reader")}
	dial := func(name string) *grpc.ClientConn {
		cc, err := rpcutil.DialPeer(ps.Addr(name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return cc
	}
	conns.Watcher, conns.Reconciler, conns.DeviceManager, conns.DRAManager = dial("watcher"), dial("reconciler"), dial("devicemanager"), dial("dramanager")
	st := New(conns, slog.New(slog.DiscardHandler))
	rctx, rcancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- st.Run(rctx) }()
	defer func() {
		rcancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	testutil.Eventually(t, "the API followed and the sample resource registered", func() error {
		snap := st.Snapshot()
		if snap.Status[API] != "" || snap.PodsOff {
			return fmt.Errorf("API status %q, off %v", snap.Status[API], snap.PodsOff)
		}
		if !slices.ContainsFunc(snap.Resources, func(r *dmv1.Resource) bool { return r.GetName() == res && r.GetCapacity() == 2 }) {
			return fmt.Errorf("resources %v", snap.Resources)
		}
		return nil
	})

	operator := kubeClient(t, layout.IdentityKubeconfigFile(root, "operator"))
	pod := func(name string, devices int64, claims ...corev1.PodResourceClaim) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name},
			Spec:       corev1.PodSpec{ResourceClaims: claims, Containers: []corev1.Container{{Name: "main", Image: "registry.example.com/app:1.0"}}},
		}
		if devices > 0 {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{res: *apiresource.NewQuantity(devices, apiresource.DecimalSI)}
		}
		for _, c := range claims {
			p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: c.Name})
		}
		return p
	}
	if _, err := operator.ResourceV1().DeviceClasses().Create(ctx, &resourcev1.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu.state.nodeplug.test"},
		Spec:       resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: `device.driver == "gpu.state.nodeplug.test"`}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the DeviceClass: %v", err)
	}
	if _, err := operator.ResourceV1().ResourceClaimTemplates("default").Create(ctx, &resourcev1.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "one-gpu"},
		Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
			Requests: []resourcev1.DeviceRequest{{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu.state.nodeplug.test"}}},
		}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the ResourceClaimTemplate: %v", err)
	}
	for _, p := range []*corev1.Pod{
		pod("fits", 2), pod("too-big", 3),
		pod("claimer", 0, corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("one-gpu")}),
	} {
		if _, err := operator.CoreV1().Pods("default").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create pod %s: %v", p.Name, err)
		}
	}

	var fitsUID string
	testutil.Eventually(t, "pod fits bound, waiting for a runtime, with its two devices", func() error {
		snap := st.Snapshot()
		p := snapPod(snap, "default", "fits")
		if p == nil {
			return fmt.Errorf("no pod fits in %d pods", len(snap.Pods))
		}
		fitsUID = string(p.UID)
		if p.Spec.NodeName == "" || len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil ||
			p.Status.ContainerStatuses[0].State.Waiting.Reason != "NoContainerRuntime" {
			return fmt.Errorf("node %q, container statuses %+v", p.Spec.NodeName, p.Status.ContainerStatuses)
		}
		i := slices.IndexFunc(snap.Allocations, func(a *dmv1.Allocation) bool { return a.GetPodUid() == fitsUID })
		if i < 0 || len(snap.Allocations[i].GetDeviceIds()) != 2 {
			return fmt.Errorf("allocations %v", snap.Allocations)
		}
		if r := snapReasons(snap, p); len(r) == 0 || r[0] != "Scheduled" {
			return fmt.Errorf("events %v, want Scheduled first", r)
		}
		return nil
	})
	testutil.Eventually(t, "pod too-big Pending with UnexpectedAdmissionError", func() error {
		snap := st.Snapshot()
		p := snapPod(snap, "default", "too-big")
		if p == nil || p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
			return fmt.Errorf("pod %+v", p)
		}
		if r := snapReasons(snap, p); !slices.Contains(r, "UnexpectedAdmissionError") {
			return fmt.Errorf("events %v", r)
		}
		return nil
	})
	testutil.Eventually(t, "pod claimer's claim made from its template and listed by the dramanager", func() error {
		snap := st.Snapshot()
		p := snapPod(snap, "default", "claimer")
		if p == nil || len(p.Status.ResourceClaimStatuses) != 1 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			return fmt.Errorf("pod %+v", p)
		}
		claim := *p.Status.ResourceClaimStatuses[0].ResourceClaimName
		if !slices.ContainsFunc(snap.Claims, func(c *dmv1.Claim) bool { return c.GetNamespace() == "default" && c.GetName() == claim }) {
			return fmt.Errorf("claim %s not among %v (%q)", claim, snap.Claims, snap.ClaimsProblem)
		}
		return nil
	})
	// Oldest first, as the views expect.
	snap := st.Snapshot()
	if len(snap.Events) < 2 || !slices.IsSortedFunc(snap.Events, podinfo.CompareEvents) {
		t.Errorf("%d events, not oldest first", len(snap.Events))
	}

	// kill -9 of the API: its status goes down; after the restart the
	// state follows it again from a new list.
	ps.Kill("apiserver")
	testutil.Eventually(t, "the API reported down", func() error {
		if st.Snapshot().Status[API] == "" {
			return fmt.Errorf("still synced")
		}
		return nil
	})
	if err := ps.Start(ctx, "apiserver"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "pod fits deleted after the restart", func() error {
		return operator.CoreV1().Pods("default").Delete(ctx, "fits", metav1.DeleteOptions{})
	})
	testutil.Eventually(t, "pod fits and its devices gone from the state, the API synced", func() error {
		snap := st.Snapshot()
		if snapPod(snap, "default", "fits") != nil {
			return fmt.Errorf("pod fits still there (API status %q)", snap.Status[API])
		}
		if slices.ContainsFunc(snap.Allocations, func(a *dmv1.Allocation) bool { return a.GetPodUid() == fitsUID }) {
			return fmt.Errorf("its allocation is still listed")
		}
		if snap.Status[API] != "" || snapPod(snap, "default", "too-big") == nil {
			return fmt.Errorf("API status %q, %d pods", snap.Status[API], len(snap.Pods))
		}
		return nil
	})
}
