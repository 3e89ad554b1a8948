package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/apiserver/apiservertest"
)

// startAPI serves the node-local API under a new root dir, and returns
// the root and a client with the operator's identity.
func startAPI(t *testing.T) (string, kubernetes.Interface) {
	t.Helper()
	root := testutil.TempDir(t)
	api := apiservertest.Start(t, root, "node-a")
	return root, api.ClientFor(t, layout.IdentityKubeconfigFile(root, "operator"))
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// gone fails the test unless get says NotFound.
func gone(t *testing.T, what string, get func() error) {
	t.Helper()
	if err := get(); !apierrors.IsNotFound(err) {
		t.Errorf("%s: %v, want NotFound", what, err)
	}
}

// TestApplyAndDeleteAgainstTheNodeLocalAPI applies a file of every kind
// the node-local API lets its operator write, in an order none could be
// created in (the pod before its namespace), to a real node-local API;
// then again (unchanged), with a label changed (configured, from standard
// input); then deletes a pod by NS/NAME and the file's objects.
func TestApplyAndDeleteAgainstTheNodeLocalAPI(t *testing.T) {
	root, op := startAPI(t)
	ctx := context.Background()
	file := filepath.Join(root, "demo.yaml")
	writeFile(t, file, everyKind)

	code, out, errOut := runCLI(t, "--root-dir", root, "apply", "-f", file, "-n", "demo")
	if code != exitOK {
		t.Fatalf("apply: exit %d: %s%s", code, out, errOut)
	}
	applied := func(pod string, others string) string {
		return "namespace/demo " + others + "\n" +
			"devicetaintrule.resource.k8s.io/gpu-0-broken " + others + "\n" +
			"deviceclass.resource.k8s.io/gpu.example.com " + others + "\n" +
			"resourceclaim.resource.k8s.io/shared-gpu " + others + "\n" +
			"resourceclaimtemplate.resource.k8s.io/gpu-template " + others + "\n" +
			"pod/demo-pod " + pod + "\n" +
			"event/demo-pod.started " + others + "\n"
	}
	if want := applied("created", "created"); out != want {
		t.Errorf("apply printed:\n%s\nwant:\n%s", out, want)
	}
	pod, err := op.CoreV1().Pods("demo").Get(ctx, "demo-pod", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels["app"] != "demo" || len(pod.Spec.ResourceClaims) != 2 || *pod.Spec.ResourceClaims[0].ResourceClaimTemplateName != "gpu-template" ||
		pod.Spec.Containers[0].Resources.Limits.Cpu().String() != "1" {
		t.Errorf("stored pod: %+v", pod)
	}
	claim, err := op.ResourceV1().ResourceClaims("demo").Get(ctx, "shared-gpu", metav1.GetOptions{})
	if err != nil || claim.Spec.Devices.Requests[0].Exactly.Count != 2 || claim.Spec.Devices.Requests[0].Exactly.DeviceClassName != "gpu.example.com" {
		t.Errorf("stored claim (in the namespace of -n): %+v, %v", claim, err)
	}
	tmpl, err := op.ResourceV1().ResourceClaimTemplates("demo").Get(ctx, "gpu-template", metav1.GetOptions{})
	if err != nil || tmpl.Spec.Spec.Devices.Requests[0].Exactly.DeviceClassName != "gpu.example.com" {
		t.Errorf("stored template: %+v, %v", tmpl, err)
	}
	class, err := op.ResourceV1().DeviceClasses().Get(ctx, "gpu.example.com", metav1.GetOptions{})
	if err != nil || class.Spec.Selectors[0].CEL.Expression != `device.driver == "gpu.example.com"` || class.Namespace != "" {
		t.Errorf("stored class: %+v, %v", class, err)
	}
	rule, err := op.ResourceV1().DeviceTaintRules().Get(ctx, "gpu-0-broken", metav1.GetOptions{})
	if err != nil || rule.Spec.Taint.Key != "example.com/broken" || *rule.Spec.DeviceSelector.Device != "gpu-0" {
		t.Errorf("stored taint rule: %+v, %v", rule, err)
	}
	ev, err := op.CoreV1().Events("demo").Get(ctx, "demo-pod.started", metav1.GetOptions{})
	if err != nil || ev.Reason != "Started" || ev.InvolvedObject.Name != "demo-pod" {
		t.Errorf("stored event: %+v, %v", ev, err)
	}
	if _, err := op.CoreV1().Namespaces().Get(ctx, "demo", metav1.GetOptions{}); err != nil {
		t.Errorf("stored namespace: %v", err)
	}

	// Again: the API holds every field the file sets.
	code, out, errOut = runCLI(t, "--root-dir", root, "apply", "-f", file, "--namespace", "demo")
	if want := applied("unchanged", "unchanged"); code != exitOK || out != want {
		t.Errorf("apply again: exit %d:\n%s%s\nwant:\n%s", code, out, errOut, want)
	}

	// A label changed, from standard input: the pod is updated, its
	// status left as the API has it.
	pod.Status.Phase = corev1.PodRunning
	if pod, err = op.CoreV1().Pods("demo").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuffer
	changed := strings.Replace(everyKind, "    app: demo\n", "    app: demo-2\n", 1)
	code = runIO(ctx, []string{"--root-dir", root, "apply", "-n", "demo", "-f", "-"}, strings.NewReader(changed), &stdout, &stderr)
	if want := applied("configured", "unchanged"); code != exitOK || stdout.String() != want {
		t.Errorf("apply of a changed label: exit %d:\n%s%s\nwant:\n%s", code, stdout.String(), stderr.String(), want)
	}
	after, err := op.CoreV1().Pods("demo").Get(ctx, "demo-pod", metav1.GetOptions{})
	if err != nil || after.Labels["app"] != "demo-2" || after.UID != pod.UID || after.ResourceVersion == pod.ResourceVersion || after.Status.Phase != corev1.PodRunning {
		t.Errorf("pod after the label changed: %+v, %v (before: uid %s, resourceVersion %s, phase Running)", after, err, pod.UID, pod.ResourceVersion)
	}

	// Delete by NS/NAME; then it is not found, unless that is ignored.
	code, out, errOut = runCLI(t, "--root-dir", root, "delete", "pod", "demo/demo-pod")
	if code != exitOK || out != "pod/demo-pod deleted\n" || errOut != "" {
		t.Errorf("delete pod demo/demo-pod: exit %d: %s%s", code, out, errOut)
	}
	gone(t, "the pod deleted", func() error {
		_, err := op.CoreV1().Pods("demo").Get(ctx, "demo-pod", metav1.GetOptions{})
		return err
	})
	code, out, errOut = runCLI(t, "--root-dir", root, "delete", "pod", "demo/demo-pod")
	if code != exitError || out != "" || !strings.Contains(errOut, `Error from server (NotFound): pods "demo-pod" not found`) ||
		!strings.Contains(errOut, "nodeplugctl delete: 1 object was not found") {
		t.Errorf("delete of a pod already gone: exit %d: %s%s", code, out, errOut)
	}
	code, out, errOut = runCLI(t, "--root-dir", root, "delete", "po", "demo-pod", "-n", "demo", "--ignore-not-found")
	if code != exitOK || out != "" || errOut != "" {
		t.Errorf("delete --ignore-not-found of a pod already gone: exit %d: %s%s", code, out, errOut)
	}

	// The file's objects, the other way round; the pod was gone already.
	code, out, errOut = runCLI(t, "--root-dir", root, "delete", "-f", file, "-n", "demo")
	want := "event/demo-pod.started deleted\n" +
		"resourceclaim.resource.k8s.io/shared-gpu deleted\n" +
		"resourceclaimtemplate.resource.k8s.io/gpu-template deleted\n" +
		"devicetaintrule.resource.k8s.io/gpu-0-broken deleted\n" +
		"deviceclass.resource.k8s.io/gpu.example.com deleted\n" +
		"namespace/demo deleted\n"
	if code != exitError || out != want || !strings.Contains(errOut, `Error from server (NotFound): pods "demo-pod" not found`) {
		t.Errorf("delete -f: exit %d:\n%s%s\nwant:\n%s", code, out, errOut, want)
	}
	gone(t, "the namespace", func() error {
		_, err := op.CoreV1().Namespaces().Get(ctx, "demo", metav1.GetOptions{})
		return err
	})
	gone(t, "the class", func() error {
		_, err := op.ResourceV1().DeviceClasses().Get(ctx, "gpu.example.com", metav1.GetOptions{})
		return err
	})
	gone(t, "the taint rule", func() error {
		_, err := op.ResourceV1().DeviceTaintRules().Get(ctx, "gpu-0-broken", metav1.GetOptions{})
		return err
	})
	gone(t, "the claim", func() error {
		_, err := op.ResourceV1().ResourceClaims("demo").Get(ctx, "shared-gpu", metav1.GetOptions{})
		return err
	})
	code, out, errOut = runCLI(t, "--root-dir", root, "delete", "--ignore-not-found", "-f", file, "-n", "demo")
	if code != exitOK || out != "" || errOut != "" {
		t.Errorf("delete -f --ignore-not-found of objects gone: exit %d: %s%s", code, out, errOut)
	}
}

// TestApplyAppliesNothingOfABadFile: a file whose last document is of a
// kind the API does not take, or does not decode, creates none of the
// others; a namespaced object in a namespace that does not exist is the
// API's NotFound, naming the namespace.
func TestApplyAppliesNothingOfABadFile(t *testing.T) {
	root, op := startAPI(t)
	ctx := context.Background()
	file := filepath.Join(root, "bad.yaml")
	for last, want := range map[string]string{
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n":                        "document 9: kind ConfigMap of v1 cannot be applied",
		"apiVersion: resource.k8s.io/v1beta2\nkind: DeviceClass\nmetadata:\n  name: c\n": "document 9: kind DeviceClass of resource.k8s.io/v1beta2 cannot be applied",
		"apiVersion: v1\nkind: Namespace\nmetadata:\n  name: c\nbogus: 1\n":              `document 9: strict decoding error: unknown field "bogus"`,
	} {
		writeFile(t, file, everyKind+"---\n"+last)
		code, out, errOut := runCLI(t, "--root-dir", root, "apply", "-f", file)
		if code != exitError || out != "" || !strings.Contains(errOut, file+": "+want) || !strings.Contains(errOut, "(nothing was applied)") {
			t.Errorf("apply of a file ending in %q: exit %d: %s%s, want %q", last, code, out, errOut, want)
		}
		code, out, errOut = runCLI(t, "--root-dir", root, "delete", "-f", file)
		if code != exitError || out != "" || !strings.Contains(errOut, "(nothing was deleted)") {
			t.Errorf("delete of a file ending in %q: exit %d: %s%s", last, code, out, errOut)
		}
	}
	gone(t, "the namespace", func() error {
		_, err := op.CoreV1().Namespaces().Get(ctx, "demo", metav1.GetOptions{})
		return err
	})
	gone(t, "the class", func() error {
		_, err := op.ResourceV1().DeviceClasses().Get(ctx, "gpu.example.com", metav1.GetOptions{})
		return err
	})

	writeFile(t, file, "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: nowhere\nspec:\n  containers:\n  - name: main\n    image: app\n")
	code, out, errOut := runCLI(t, "--root-dir", root, "apply", "-f", file)
	if code != exitError || out != "" || !strings.Contains(errOut, "apply pod/p in namespace nowhere (document 1) at https://") || !strings.Contains(errOut, `namespaces "nowhere" not found`) {
		t.Errorf("apply of a pod in a namespace that does not exist: exit %d: %s%s", code, out, errOut)
	}
}
