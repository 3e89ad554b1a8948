package draserver_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/dra/dratest"
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
	want := "deviceclass.resource.k8s.io/gpu created\nresourceclaim.resource.k8s.io/gpu-claim in namespace default created\n"
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
	if want := "deviceclass.resource.k8s.io/gpu unchanged\nresourceclaim.resource.k8s.io/gpu-claim in namespace default unchanged\n"; err != nil || out != want {
		t.Errorf("second apply: %v\n%s\nwant:\n%s", err, out, want)
	}
	out, err = apply("b")
	if want := "deviceclass.resource.k8s.io/gpu unchanged\nresourceclaim.resource.k8s.io/gpu-claim in namespace default configured\n"; err != nil || out != want {
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
