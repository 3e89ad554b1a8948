package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"
)

// everyKind is a file with one object of each kind apply takes, in the
// reverse of the order apply creates them.
const everyKind = `apiVersion: v1
kind: Event
metadata:
  name: demo-pod.started
  namespace: demo
involvedObject:
  apiVersion: v1
  kind: Pod
  name: demo-pod
  namespace: demo
reason: Started
message: demo-pod started
type: Normal
---
apiVersion: v1
kind: Pod
metadata:
  name: demo-pod
  namespace: demo
  labels:
    app: demo
spec:
  containers:
  - name: main
    image: registry.example/app:1
    resources:
      limits:
        cpu: 1000m
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: gpu-template
  - name: shared
    resourceClaimName: shared-gpu
---
# a comment only
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: shared-gpu
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.example.com
        count: 2
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: gpu-template
  namespace: demo
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.example.com
---
apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata:
  name: gpu-0-broken
spec:
  deviceSelector:
    driver: gpu.example.com
    device: gpu-0
  taint:
    key: example.com/broken
    effect: NoSchedule
---
{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.example.com", "namespace": "ignored"},
 "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.example.com\""}}]}}
---
apiVersion: v1
kind: Namespace
metadata:
  name: demo
`

// TestDecodeObjects: every kind the node-local API lets its operator
// write is taken, with the fields its document sets; the order apply and
// delete go in.
func TestDecodeObjects(t *testing.T) {
	objs, err := decodeObjects([]byte(everyKind), "applied")
	if err != nil {
		t.Fatal(err)
	}
	inNamespace(objs, "team")
	var got []string
	for _, o := range objs {
		got = append(got, o.name()+" "+o.obj.GetNamespace())
	}
	want := []string{
		"event/demo-pod.started demo",
		"pod/demo-pod demo",
		"resourceclaim.resource.k8s.io/shared-gpu team",
		"resourceclaimtemplate.resource.k8s.io/gpu-template demo",
		"devicetaintrule.resource.k8s.io/gpu-0-broken ",
		"deviceclass.resource.k8s.io/gpu.example.com ",
		"namespace/demo ",
	}
	if !slices.Equal(got, want) {
		t.Errorf("objects:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if docs := []int{objs[0].doc, objs[2].doc, objs[6].doc}; !slices.Equal(docs, []int{1, 4, 8}) {
		t.Errorf("documents %v, want 1 4 8 (the comment-only one counts)", docs)
	}
	order := func(down bool) []string {
		var out []string
		for _, o := range byRank(objs, down) {
			out = append(out, o.kind.singular)
		}
		return out
	}
	if got, want := order(false), []string{"namespace", "devicetaintrule", "deviceclass", "resourceclaim", "resourceclaimtemplate", "pod", "event"}; !slices.Equal(got, want) {
		t.Errorf("apply order %v, want %v", got, want)
	}
	if got, want := order(true), []string{"event", "pod", "resourceclaim", "resourceclaimtemplate", "devicetaintrule", "deviceclass", "namespace"}; !slices.Equal(got, want) {
		t.Errorf("delete order %v, want %v", got, want)
	}
	// The fields set: as written, with the typed object's values (a
	// quantity as the API writes it), no zero values the file did not set.
	pod := objs[1]
	if cpu := pod.set["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["resources"].(map[string]any)["limits"].(map[string]any)["cpu"]; cpu != "1" {
		t.Errorf("the pod's cpu limit as set: %v, want 1", cpu)
	}
	if _, ok := pod.set["status"]; ok {
		t.Error("the pod's fields set have a status")
	}
	if _, ok := pod.obj.Object["status"]; ok {
		t.Error("the pod as sent has a status")
	}
	if md := objs[5].set["metadata"].(map[string]any); len(md) != 1 || md["name"] != "gpu.example.com" {
		t.Errorf("the class's metadata as set: %v, want its name only", md)
	}
	if objs[5].obj.GetNamespace() != "" {
		t.Errorf("the class is sent in namespace %q", objs[5].obj.GetNamespace())
	}
	claim := objs[2].set["spec"].(map[string]any)["devices"].(map[string]any)["requests"].([]any)[0].(map[string]any)
	if _, ok := claim["firstAvailable"]; ok || len(claim) != 2 {
		t.Errorf("the claim's request as set: %v", claim)
	}
}

func TestDecodeObjectsRefuses(t *testing.T) {
	class := "apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: a\n"
	for doc, want := range map[string]string{
		class + "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: p\n": "document 2: kind ConfigMap of v1 cannot be applied: only Namespace, Pod, Event of v1; " +
			"DeviceClass, DeviceTaintRule, ResourceClaimTemplate, ResourceClaim of resource.k8s.io/v1 can be",
		"apiVersion: resource.k8s.io/v1beta2\nkind: DeviceClass\nmetadata:\n  name: a\n": "document 1: kind DeviceClass of resource.k8s.io/v1beta2 cannot be applied " +
			"(the node-local API serves DeviceClass at resource.k8s.io/v1 only)",
		class + "---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n":                       "document 2: kind Widget of example.com/v1 cannot be applied",
		"apiVersion: v1\nkind: Node\nmetadata:\n  name: n\n":                                                  "document 1: kind Node of v1 cannot be applied",
		"apiVersion: resource.k8s.io/v1\nkind: ResourceSlice\nmetadata:\n  name: s\n":                         "document 1: kind ResourceSlice of resource.k8s.io/v1 cannot be applied",
		class + "spec:\n  bogus: 1\n":                                                                         `document 1: strict decoding error: unknown field "spec.bogus"`,
		class + "---\n" + class + "metadata:\n  name: b\n":                                                    "document 2: yaml: unmarshal errors:\n  line 6: key \"metadata\" already set in map",
		"{\"apiVersion\": \"v1\", \"kind\": \"Namespace\", \"metadata\": {\"name\": \"a\", \"name\": \"b\"}}": `document 1: strict decoding error: duplicate field "metadata.name"`,
		class + "---\nkind: [\n":                                                                              "document 2",
		"kind: DeviceClass\nmetadata:\n  name: a\n":                                                           "document 1: Object 'apiVersion' is missing",
		"apiVersion: v1\nkind: Pod\nmetadata:\n  generateName: p-\n":                                          "document 1: Pod: metadata.generateName is not supported",
		"apiVersion: v1\nkind: Namespace\nmetadata:\n  labels:\n    a: b\n":                                   "document 1: Namespace: metadata.name is required",
	} {
		if _, err := decodeObjects([]byte(doc), "applied"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("decodeObjects(%q) = %v, want an error with %q", doc, err, want)
		}
	}
	if _, err := decodeObjects([]byte("apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n"), "deleted"); err == nil ||
		!strings.Contains(err.Error(), "kind Secret of v1 cannot be deleted") {
		t.Errorf("delete of a Secret: %v", err)
	}
}

func TestApplyRefusesBadFilesBeforeDialling(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The kubeconfig does not exist: the file's error comes first.
	for _, cmd := range []string{"apply", "delete"} {
		verb := map[string]string{"apply": "applied", "delete": "deleted"}[cmd]
		code, _, errOut := runCLI(t, "--root-dir", dir, cmd, "-f", bad)
		if code != exitError || !strings.Contains(errOut, bad+": document 1: kind ConfigMap of v1 cannot be "+verb) || !strings.Contains(errOut, "nothing was "+verb) {
			t.Errorf("%s of a ConfigMap: exit %d: %s", cmd, code, errOut)
		}
		var out, errBuf syncBuffer
		code = runIO(context.Background(), []string{"--root-dir", dir, cmd, "-f", "-"}, strings.NewReader("kind: Pod\n"), &out, &errBuf)
		if code != exitError || !strings.Contains(errBuf.String(), "standard input: document 1: Object 'apiVersion' is missing") {
			t.Errorf("%s -f - of a bad file: exit %d: %s", cmd, code, errBuf.String())
		}
		code, _, errOut = runCLI(t, "--root-dir", dir, cmd, "-f", "-")
		if code != exitError || !strings.Contains(errOut, "no standard input") {
			t.Errorf("%s -f - without standard input: exit %d: %s", cmd, code, errOut)
		}
		code, _, errOut = runCLI(t, "--root-dir", dir, cmd, "-f", filepath.Join(dir, "none.yaml"))
		if code != exitError || !strings.Contains(errOut, "no such file") {
			t.Errorf("%s of a missing file: exit %d: %s", cmd, code, errOut)
		}
	}
	empty := filepath.Join(dir, "empty.yaml")
	if err := os.WriteFile(empty, []byte("---\n# nothing\n---\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runCLI(t, "--root-dir", dir, "apply", "-f", empty); code != exitError || !strings.Contains(errOut, "no object in it") {
		t.Errorf("apply of an empty file: exit %d: %s", code, errOut)
	}
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte("apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n  name: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCLI(t, "--root-dir", dir, "apply", "-f", good)
	if code != exitError || !strings.Contains(errOut, filepath.Join(dir, "nodeplug", "kubeconfig-operator")) {
		t.Errorf("apply without the node-local API's kubeconfig: exit %d: %s", code, errOut)
	}
	if code, _, errOut = runCLI(t, "apply"); code != exitUsage || !strings.Contains(errOut, "-f FILE is required") {
		t.Errorf("apply without -f: exit %d: %s", code, errOut)
	}
	for args, want := range map[string]string{
		"delete":                         "name the objects: -f FILE, KIND NAME or KIND/NAME",
		"delete -f x.yaml pod p":         `-f FILE names the objects: unexpected arguments ["pod" "p"]`,
		"delete pod":                     "name the pod to delete: pod NAME",
		"delete widget w":                `unknown kind "widget": delete takes namespace (namespaces, ns), deviceclass (deviceclasses)`,
		"delete ns a/b":                  "namespace/a/b: a namespace is not in a namespace: name it alone",
		"delete pod a/b -n c":            "pod/b is in namespace a, not --namespace c",
		"delete pod a/b/c":               `"a/b/c": want NAME or NAMESPACE/NAME`,
		"delete pod/a widget/b":          `unknown kind "widget"`,
		"delete pod/a/b":                 `"pod/a/b": want KIND/NAME (with --namespace for the namespace)`,
		"delete --ignore-not-found=nope": "invalid boolean value",
	} {
		code, _, errOut := runCLI(t, strings.Fields(args)...)
		if code != exitUsage || !strings.Contains(errOut, want) || !strings.Contains(errOut, "usage: nodeplugctl delete -f FILE.yaml|-") {
			t.Errorf("%s: exit %d: %s, want a usage error with %q", args, code, errOut, want)
		}
	}
}

// TestParseTargets: a kind by any of its names, NS/NAME or the
// namespace flag, KIND/NAME as nodeplugctl prints it.
func TestParseTargets(t *testing.T) {
	for _, tc := range []struct {
		args     string
		ns       string
		explicit bool
		want     []string
	}{
		{"pod demo/demo-pod", "default", false, []string{"pod/demo-pod in demo"}},
		{"po a b", "team", true, []string{"pod/a in team", "pod/b in team"}},
		{"pods demo/a b", "default", false, []string{"pod/a in demo", "pod/b in default"}},
		{"Pod demo/a", "demo", true, []string{"pod/a in demo"}},
		{"ns demo", "x", true, []string{"namespace/demo in "}},
		{"namespaces demo", "default", false, []string{"namespace/demo in "}},
		{"ev e", "default", false, []string{"event/e in default"}},
		{"events e", "default", false, []string{"event/e in default"}},
		{"resourceclaim c", "default", false, []string{"resourceclaim.resource.k8s.io/c in default"}},
		{"resourceclaims.resource.k8s.io ns1/c", "default", false, []string{"resourceclaim.resource.k8s.io/c in ns1"}},
		{"resourceclaimtemplate t", "default", false, []string{"resourceclaimtemplate.resource.k8s.io/t in default"}},
		{"deviceclass gpu.example.com", "x", true, []string{"deviceclass.resource.k8s.io/gpu.example.com in "}},
		{"DeviceClass gpu", "default", false, []string{"deviceclass.resource.k8s.io/gpu in "}},
		{"devicetaintrules r", "default", false, []string{"devicetaintrule.resource.k8s.io/r in "}},
		{"deviceclass.resource.k8s.io/gpu pod/p", "demo", true, []string{"deviceclass.resource.k8s.io/gpu in ", "pod/p in demo"}},
	} {
		targets, err := parseTargets(strings.Fields(tc.args), tc.ns, tc.explicit)
		if err != nil {
			t.Errorf("%s: %v", tc.args, err)
			continue
		}
		var got []string
		for _, tg := range targets {
			got = append(got, tg.String()+" in "+tg.namespace)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.args, got, tc.want)
		}
	}
}

func TestCoversComparesTheFieldsSet(t *testing.T) {
	written := resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{
		{Name: "gpu", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "gpu"}}}}}
	defaulted := *written.DeepCopy()
	defaulted.Devices.Requests[0].Exactly.AllocationMode = resourcev1.DeviceAllocationModeExactCount
	defaulted.Devices.Requests[0].Exactly.Count = 1
	if !covers(defaulted, written) {
		t.Error("a defaulted spec does not cover the spec as written")
	}
	changed := *defaulted.DeepCopy()
	changed.Devices.Requests[0].Exactly.DeviceClassName = "other"
	if covers(changed, written) {
		t.Error("a spec with another class covers the spec as written")
	}
	more := *written.DeepCopy()
	more.Devices.Requests = append(more.Devices.Requests, resourcev1.DeviceRequest{Name: "nic"})
	if covers(defaulted, more) {
		t.Error("a spec with one request covers one with two")
	}
}

// TestFieldsSetCoverStoredObjects: what a file sets is covered by the
// object as the API gives it back (defaults filled in, the server's
// metadata, a status), and not when a label or a value differs.
func TestFieldsSetCoverStoredObjects(t *testing.T) {
	objs, err := decodeObjects([]byte(`apiVersion: v1
kind: Pod
metadata:
  name: p
  labels: {app: demo}
  resourceVersion: "7"
spec:
  containers:
  - name: main
    image: app
    resources: {limits: {memory: 1Gi}}
status:
  phase: Running
`), "applied")
	if err != nil {
		t.Fatal(err)
	}
	stored := func(label, memory string) map[string]any {
		return map[string]any{"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": "p", "namespace": "default", "uid": "u1", "resourceVersion": "12",
				"creationTimestamp": "2026-01-01T00:00:00Z", "labels": map[string]any{"app": label, "other": "x"}},
			"spec": map[string]any{"restartPolicy": "Always", "containers": []any{map[string]any{"name": "main", "image": "app",
				"imagePullPolicy": "Always", "resources": map[string]any{"limits": map[string]any{"memory": memory}}}}},
			"status": map[string]any{"phase": "Pending"}}
	}
	set := objs[0].set
	if !covers(stored("demo", "1Gi"), set) {
		t.Errorf("the stored pod does not cover %v", set)
	}
	if covers(stored("other", "1Gi"), set) {
		t.Error("a pod with another label covers the file's")
	}
	if covers(stored("demo", "2Gi"), set) {
		t.Error("a pod with another limit covers the file's")
	}
}
