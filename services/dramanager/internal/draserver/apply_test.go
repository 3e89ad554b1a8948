package draserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
)

const applyYAML = `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu
spec:
  selectors:
  - cel:
      expression: device.driver == "gpu.example.com"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: gpu-claim
  labels:
    team: LABEL
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu
`

// nodeplugctl apply, the real binary, writes a DeviceClass and a
// ResourceClaim through the node-local resource API with the operator's
// kubeconfig under the root dir: created, then unchanged, then configured
// when the file changes; the reader's kubeconfig is refused by the API.
func TestNodeplugctlApplyThroughTheNodeLocalAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nodeplugctl")
	}
	bin := t.TempDir()
	if err := stack.Build(context.Background(), bin, "nodeplugctl"); err != nil {
		t.Fatal(err)
	}
	root := testutil.TempDir(t)
	api := dratest.StartAPI(t, root)
	file := filepath.Join(t.TempDir(), "claims.yaml")
	apply := func(label string, extra ...string) (string, error) {
		t.Helper()
		if err := os.WriteFile(file, []byte(strings.ReplaceAll(applyYAML, "LABEL", label)), 0o600); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"--root-dir", root, "apply", "-f", file}, extra...)
		out, err := exec.Command(filepath.Join(bin, "nodeplugctl"), args...).CombinedOutput()
		return string(out), err
	}
	out, err := apply("a")
	want := "deviceclass.resource.k8s.io/gpu created\nresourceclaim.resource.k8s.io/gpu-claim created\n"
	if err != nil || out != want {
		t.Fatalf("first apply: %v\n%s\nwant:\n%s", err, out, want)
	}
	ctx := context.Background()
	if _, err := api.Client.ResourceV1().DeviceClasses().Get(ctx, "gpu", metav1.GetOptions{}); err != nil {
		t.Errorf("the DeviceClass is not in the API: %v", err)
	}
	c, err := api.Client.ResourceV1().ResourceClaims("default").Get(ctx, "gpu-claim", metav1.GetOptions{})
	if err != nil || c.Labels["team"] != "a" || c.Spec.Devices.Requests[0].Exactly.DeviceClassName != "gpu" {
		t.Fatalf("the claim in the API: %+v, %v", c, err)
	}
	out, err = apply("a")
	if want := "deviceclass.resource.k8s.io/gpu unchanged\nresourceclaim.resource.k8s.io/gpu-claim unchanged\n"; err != nil || out != want {
		t.Errorf("second apply: %v\n%s\nwant:\n%s", err, out, want)
	}
	out, err = apply("b")
	if want := "deviceclass.resource.k8s.io/gpu unchanged\nresourceclaim.resource.k8s.io/gpu-claim configured\n"; err != nil || out != want {
		t.Errorf("apply of a changed label: %v\n%s\nwant:\n%s", err, out, want)
	}
	if c, err := api.Client.ResourceV1().ResourceClaims("default").Get(ctx, "gpu-claim", metav1.GetOptions{}); err != nil || c.Labels["team"] != "b" {
		t.Errorf("the claim after the update: %+v, %v", c, err)
	}
	out, err = apply("c", "--kubeconfig", filepath.Join(root, "nodeplug", "kubeconfig-reader"))
	if err == nil || !strings.Contains(out, "forbidden") {
		t.Errorf("apply as a reader: %v\n%s\nwant the API's refusal", err, out)
	}
}

// The walk-through of a driver author with the real nodeplugctl: apply a
// DeviceClass and a claim, prepare it for a pod, list the claims and the
// slices with the devices' health.
func TestNodeplugctlPrepareAndClaims(t *testing.T) {
	if testing.Short() {
		t.Skip("builds nodeplugctl")
	}
	bin := t.TempDir()
	if err := stack.Build(context.Background(), bin, "nodeplugctl"); err != nil {
		t.Fatal(err)
	}
	e := startClaims(t)
	p := dratest.NewPlugin(gpu)
	p.SetHealth(kubeletplugin.DeviceHealth{PoolName: dratest.Node, DeviceName: "dev-0", Health: kubeletplugin.HealthStatusHealthy},
		kubeletplugin.DeviceHealth{PoolName: dratest.Node, DeviceName: "dev-1", Health: kubeletplugin.HealthStatusHealthy})
	d := dratest.StartDriverWith(t, e.api, gpu, "", p)
	e.register(t, d)
	d.Publish(t, 2)
	dratest.WaitSlices(t, e.api.Client, gpu, 1, 2)
	testutil.Eventually(t, "the driver's health seen", func() error {
		if h, _ := e.reg.Health(gpu, dratest.Node, "dev-0"); h != drivers.HealthHealthy {
			return fmt.Errorf("health of dev-0 = %q", h)
		}
		return nil
	})
	ctl := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(bin, "nodeplugctl"), append([]string{"--root-dir", e.api.Root, "--dramanager-addr", e.sock}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("nodeplugctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		t.Logf("$ nodeplugctl %s\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	file := filepath.Join(t.TempDir(), "claims.yaml")
	if err := os.WriteFile(file, []byte(strings.ReplaceAll(applyYAML, "LABEL", "a")), 0o600); err != nil {
		t.Fatal(err)
	}
	ctl("apply", "-f", file)
	if out := ctl("claims"); !strings.Contains(out, "default/gpu-claim  pending") {
		t.Errorf("claims before prepare:\n%s", out)
	}
	out := ctl("prepare", "--pod-uid", "uid-1", "--namespace", "default", "--name", "pod-1", "--claim", "gpu=gpu-claim", "--container", "main=gpu")
	c, err := e.api.Client.ResourceV1().ResourceClaims("default").Get(context.Background(), "gpu-claim", metav1.GetOptions{})
	if err != nil || c.Status.Allocation == nil {
		t.Fatalf("the claim after prepare: %+v, %v", c, err)
	}
	dev := c.Status.Allocation.Devices.Results[0].Device
	if id := dratest.CDIID(c.UID, dev); !strings.Contains(out, "main       "+id) {
		t.Errorf("prepare output does not give main the CDI ID %s", id)
	}
	// The same call again is the saved answer; the driver is not called.
	var again struct {
		Containers []struct {
			Name         string
			CdiDeviceIds []string
		}
	}
	if err := json.Unmarshal([]byte(ctl("prepare", "-o", "json", "--pod-uid", "uid-1", "--namespace", "default", "--name", "pod-1",
		"--claim", "gpu=gpu-claim", "--container", "main=gpu")), &again); err != nil || len(again.Containers) != 1 ||
		len(again.Containers[0].CdiDeviceIds) != 1 || again.Containers[0].CdiDeviceIds[0] != dratest.CDIID(c.UID, dev) {
		t.Errorf("prepare again, as JSON: %+v, %v", again, err)
	}
	if n, _ := p.Calls(c.UID); n != 1 {
		t.Errorf("the driver prepared the claim %d times, want once", n)
	}
	ctl("claims", "-o", "json")
	out = ctl("claims")
	if !strings.Contains(out, "default/gpu-claim  prepared  gpu.example.com  "+dratest.Node+"/"+dev+"  "+dev+"=Healthy") || !strings.Contains(out, "pod-1") {
		t.Errorf("claims after prepare:\n%s", out)
	}
	if out := ctl("slices"); !strings.Contains(out, "Healthy") {
		t.Errorf("slices without health:\n%s", out)
	}

	// A driver's error for a claim fails the prepare with its message; the
	// claim shows as failed with it. A claim no device fits fails with the
	// allocator's reason.
	e.pendingClaim(t, "bad", "gpu")
	p.Fail("bad", "device dev-1 does not answer")
	cmd := exec.Command(filepath.Join(bin, "nodeplugctl"), "--dramanager-addr", e.sock, "prepare", "--pod-uid", "uid-2", "--namespace", "default",
		"--name", "pod-2", "--claim", "gpu=bad", "--container", "main=gpu")
	failed, err := cmd.CombinedOutput()
	t.Logf("$ nodeplugctl %s\n%s", strings.Join(cmd.Args[3:], " "), failed)
	if err == nil || !strings.Contains(string(failed), "device dev-1 does not answer") {
		t.Errorf("prepare with a failing driver: %v\n%s", err, failed)
	}
	if out := ctl("claims"); !strings.Contains(out, "default/bad        failed") || !strings.Contains(out, "device dev-1 does not answer") {
		t.Errorf("claims after the failed prepare:\n%s", out)
	}
	e.pendingClaim(t, "nofit", "nosuchclass")
	cmd = exec.Command(filepath.Join(bin, "nodeplugctl"), "--dramanager-addr", e.sock, "prepare", "--pod-uid", "uid-3", "--namespace", "default",
		"--name", "pod-3", "--claim", "gpu=nofit", "--container", "main=gpu")
	failed, err = cmd.CombinedOutput()
	t.Logf("$ nodeplugctl %s\n%s", strings.Join(cmd.Args[3:], " "), failed)
	if err == nil || !strings.Contains(string(failed), "nosuchclass") {
		t.Errorf("prepare of a claim of a missing class: %v\n%s", err, failed)
	}
}
