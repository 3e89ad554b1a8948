package upstream

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/testutil"
)

// The DRA features a driver's manifests use beyond one device for one
// claim — admin access, prioritized alternatives, device taints and
// DeviceTaintRules, partitionable devices, consumable capacity — each
// applied as the driver's documentation would write it and run in
// podman. The driver runs with the kubeletplugin helper's device
// metadata, so each container reads which devices it got from the file
// the helper mounts into it; a pod that cannot have its devices stays
// Pending with the allocator's reason; deleting the pods unprepares and
// frees everything.

// featuresDriver is the driver of the features' manifests.
const featuresDriver = "gpu.example.com"

// featureDevices are the driver's devices, each feature's its own (the
// requests select them by model):
//   - gpu-0 (a100): admin access;
//   - gpu-1 (h100), gpu-2 (l4): the alternatives of a prioritized list;
//   - gpu-3 (t4, tainted by the driver), gpu-4 (t4, tainted by a
//     DeviceTaintRule): taints and tolerations;
//   - gpu-5 (a30, the whole GPU) and gpu-5-half-0, gpu-5-half-1 (a30, each
//     half of it): partitions of one GPU, sharing the counter set
//     gpu-5-memory (featureCounters);
//   - gpu-6 (a10): a device allocated many times, each allocation a share
//     of its memory.
func featureDevices() []resourcev1.Device {
	q := resource.MustParse
	partition := func(name, profile, memory string) resourcev1.Device {
		d := gpu(name, "a30", 5, memory)
		d.Attributes["profile"] = resourcev1.DeviceAttribute{StringValue: ptr.To(profile)}
		d.ConsumesCounters = []resourcev1.DeviceCounterConsumption{{
			CounterSet: "gpu-5-memory", Counters: map[string]resourcev1.Counter{"memory": {Value: q(memory)}},
		}}
		return d
	}
	unhealthy := gpu("gpu-3", "t4", 3, "16Gi")
	unhealthy.Taints = []resourcev1.DeviceTaint{{Key: featuresDriver + "/unhealthy", Value: "ecc-errors", Effect: resourcev1.DeviceTaintEffectNoSchedule}}
	shared := gpu("gpu-6", "a10", 6, "24Gi")
	shared.AllowMultipleAllocations = ptr.To(true)
	shared.Capacity["memory"] = resourcev1.DeviceCapacity{Value: q("24Gi"), RequestPolicy: &resourcev1.CapacityRequestPolicy{
		Default:    ptr.To(q("4Gi")),
		ValidRange: &resourcev1.CapacityRequestPolicyRange{Min: ptr.To(q("4Gi")), Max: ptr.To(q("24Gi"))},
	}}
	return []resourcev1.Device{
		gpu("gpu-0", "a100", 0, "40Gi"),
		gpu("gpu-1", "h100", 1, "80Gi"),
		gpu("gpu-2", "l4", 2, "24Gi"),
		unhealthy,
		gpu("gpu-4", "t4", 4, "16Gi"),
		partition("gpu-5", "full", "24Gi"),
		partition("gpu-5-half-0", "half", "12Gi"),
		partition("gpu-5-half-1", "half", "12Gi"),
		shared,
	}
}

// featureCounters are the shared counters of gpu-5's partitions.
func featureCounters() []resourcev1.CounterSet {
	return []resourcev1.CounterSet{{Name: "gpu-5-memory", Counters: map[string]resourcev1.Counter{"memory": {Value: resource.MustParse("24Gi")}}}}
}

// featuresNode is a podman node whose driver publishes featureDevices and
// featureCounters, with device metadata.
type featuresNode struct {
	n  *draNode
	d  *claimsDriver
	pm *podman
	cs kubernetes.Interface
}

// startFeaturesNode starts the node and waits for the driver's two slices
// (its devices and its counters) in the API.
func startFeaturesNode(t *testing.T) *featuresNode {
	t.Helper()
	counters := filepath.Join(testutil.TempDir(t), "counters.json")
	data, err := json.Marshal(featureCounters())
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, counters, string(data))
	devs := featureDevices()
	n, d, pm, cs := podmanNodeWith(t, featuresDriver, devs, "--counters-file", counters, "--device-metadata")
	testutil.Eventually(t, "the driver's device and counter slices", func() error {
		list, err := n.slices(cs, featuresDriver)
		if err != nil {
			return err
		}
		var withDevices, withCounters int
		for _, s := range list.Items {
			if len(s.Spec.Devices) > 0 {
				withDevices++
				if err := sameDevices(s.Spec.Devices, devs); err != nil {
					return err
				}
			}
			if len(s.Spec.SharedCounters) > 0 {
				withCounters++
			}
		}
		if len(list.Items) != 2 || withDevices != 1 || withCounters != 1 {
			return fmt.Errorf("%d slices, %d with devices, %d with counters: %v", len(list.Items), withDevices, withCounters, list.Items)
		}
		return nil
	})
	return &featuresNode{n: n, d: d, pm: pm, cs: cs}
}

// ctl runs nodeplugctl, failing t when it fails.
func (f *featuresNode) ctl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := f.ctlErr(t, args...)
	if err != nil {
		t.Fatalf("nodeplugctl %v: %v", args, err)
	}
	return out
}

// ctlErr runs nodeplugctl: its stdout, or an error with its stderr.
func (f *featuresNode) ctlErr(t *testing.T, args ...string) (string, error) {
	cmd := exec.CommandContext(ctxT(t), filepath.Join(binDir, "nodeplugctl"), append([]string{"--root-dir", f.n.root}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%w: %s", err, stderr.Bytes())
	}
	return string(out), nil
}

// apply writes manifest to a file of the node named name and applies it.
func (f *featuresNode) apply(t *testing.T, name, manifest string) {
	t.Helper()
	path := filepath.Join(f.n.root, name)
	writeFile(t, path, manifest)
	t.Logf("$ nodeplugctl apply -f %s\n%s", name, f.ctl(t, "apply", "-f", path))
}

// pod reads the pod ns/name.
func (f *featuresNode) pod(t *testing.T, ns, name string) (*corev1.Pod, error) {
	t.Helper()
	return f.cs.CoreV1().Pods(ns).Get(ctxT(t), name, metav1.GetOptions{})
}

// running waits until the pod runs its one container.
func (f *featuresNode) running(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	testutil.Eventually(t, "pod "+ns+"/"+name+" Running", func() (err error) {
		if pod, err = f.pod(t, ns, name); err != nil {
			return err
		}
		if pod.Status.Phase != corev1.PodRunning || len(pod.Status.ContainerStatuses) != 1 || pod.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("phase %s, containers %v, conditions %v", pod.Status.Phase, states(pod.Status.ContainerStatuses), pod.Status.Conditions)
		}
		return nil
	})
	return pod
}

// report is what the probe in the pod's container printed.
func (f *featuresNode) report(t *testing.T, pod *corev1.Pod) probeReport {
	t.Helper()
	var r probeReport
	testutil.Eventually(t, "the report of "+pod.Namespace+"/"+pod.Name, func() error {
		out, err := f.ctlErr(t, "logs", pod.Namespace+"/"+pod.Name)
		if err != nil {
			return err
		}
		return json.Unmarshal([]byte(out), &r)
	})
	return r
}

// seenDevices are the devices the pod's container sees in the driver's
// metadata file of its claim gpu (request gpu), the one path its probe
// reports, as "<request> <pool>/<device>".
func (f *featuresNode) seenDevices(t *testing.T, pod *corev1.Pod) []string {
	t.Helper()
	r := f.report(t, pod)
	if len(r.Paths) != 1 {
		t.Fatalf("%s/%s: the probe reports %v, want the device metadata file alone", pod.Namespace, pod.Name, r.Paths)
	}
	var path string
	for k := range r.Paths {
		path = k
	}
	p := r.Paths[path]
	if !strings.HasPrefix(path, metadata.ContainerDir+"/") || !p.Exists || p.Kind != "file" {
		t.Fatalf("%s/%s: the device metadata file %s: %+v", pod.Namespace, pod.Name, path, p)
	}
	var md metadatav1beta1.DeviceMetadata
	if err := json.NewDecoder(strings.NewReader(p.Content)).Decode(&md); err != nil {
		t.Fatalf("%s/%s: the device metadata file: %v\n%s", pod.Namespace, pod.Name, err, p.Content)
	}
	var out []string
	for _, req := range md.Requests {
		for _, d := range req.Devices {
			if d.Driver != featuresDriver {
				t.Errorf("%s/%s: metadata device %+v of another driver", pod.Namespace, pod.Name, d)
			}
			out = append(out, req.Name+" "+d.Pool+"/"+d.Name)
		}
	}
	slices.Sort(out)
	return out
}

// metadataPath is where the containers of a pod find the driver's
// metadata of the pod's claim gpu, request gpu: made from a template, or,
// when template is empty, the ResourceClaim claim.
func metadataPath(template, claim string) string {
	if template == "" {
		return metadata.ResourceClaimFilePath(featuresDriver, claim, "gpu")
	}
	return metadata.ResourceClaimTemplateFilePath(featuresDriver, "gpu", "gpu")
}

// scheduled reports whether the pod's PodScheduled condition is True.
func scheduled(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// claimOf is the pod's claim gpu, read from the API.
func (f *featuresNode) claimOf(t *testing.T, pod *corev1.Pod) *resourcev1.ResourceClaim {
	t.Helper()
	var claim *resourcev1.ResourceClaim
	testutil.Eventually(t, "the claim of "+pod.Namespace+"/"+pod.Name, func() error {
		p, err := f.pod(t, pod.Namespace, pod.Name)
		if err != nil {
			return err
		}
		name := ""
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.Name == "gpu" && s.ResourceClaimName != nil {
				name = *s.ResourceClaimName
			}
		}
		for _, c := range p.Spec.ResourceClaims {
			if c.Name == "gpu" && c.ResourceClaimName != nil {
				name = *c.ResourceClaimName
			}
		}
		if name == "" {
			return fmt.Errorf("no claim gpu in the status: %v", p.Status.ResourceClaimStatuses)
		}
		claim, err = f.cs.ResourceV1().ResourceClaims(pod.Namespace).Get(ctxT(t), name, metav1.GetOptions{})
		return err
	})
	return claim
}

// results are the claim's allocated devices as "<request> <pool>/<device>".
func results(c *resourcev1.ResourceClaim) []string {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		out = append(out, r.Request+" "+r.Pool+"/"+r.Device)
	}
	slices.Sort(out)
	return out
}

// twoRunOnePending waits until two of the pods names (in namespace ns)
// run and the third waits unscheduled; it returns the two and the name of
// the third.
func (f *featuresNode) twoRunOnePending(t *testing.T, ns string, names []string) (run []*corev1.Pod, waiting string) {
	t.Helper()
	testutil.Eventually(t, "two of the pods Running, one Pending", func() error {
		run, waiting = nil, ""
		for _, name := range names {
			p, err := f.pod(t, ns, name)
			if err != nil {
				return err
			}
			switch {
			case p.Status.Phase == corev1.PodRunning:
				run = append(run, p)
			case p.Status.Phase == corev1.PodPending && p.Spec.NodeName == "" && !scheduled(p):
				waiting = name
			}
		}
		if len(run) != 2 || waiting == "" {
			return fmt.Errorf("running %d, pending %q", len(run), waiting)
		}
		return nil
	})
	return run, waiting
}

// pending waits until the pod has a FailedScheduling warning event whose
// message holds every one of want, and checks that it is Pending, not
// bound, its PodScheduled condition False and Unschedulable with the
// same reason, and its container not created.
func (f *featuresNode) pending(t *testing.T, ns, name string, want ...string) *corev1.Pod {
	t.Helper()
	var event string
	testutil.Eventually(t, "pod "+ns+"/"+name+" refused", func() error {
		events, err := f.cs.CoreV1().Events(ns).List(ctxT(t), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return err
		}
		var got []string
		for _, e := range events.Items {
			got = append(got, e.Reason+": "+e.Message)
			if e.Type == corev1.EventTypeWarning && e.Reason == "FailedScheduling" && containsAll(e.Message, want) {
				event = e.Message
				return nil
			}
		}
		return fmt.Errorf("no FailedScheduling event with %q in %q", want, got)
	})
	t.Logf("%s/%s: FailedScheduling: %s", ns, name, event)
	pod, err := f.pod(t, ns, name)
	if err != nil {
		t.Fatal(err)
	}
	var cond *corev1.PodCondition
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodScheduled {
			cond = &pod.Status.Conditions[i]
		}
	}
	if pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName != "" || cond == nil || cond.Status != corev1.ConditionFalse ||
		cond.Reason != corev1.PodReasonUnschedulable || !containsAll(cond.Message, want) {
		t.Fatalf("%s/%s: phase %s, node %q, PodScheduled %+v; want Pending, unbound, Unschedulable with %q", ns, name, pod.Status.Phase, pod.Spec.NodeName, cond, want)
	}
	if got := f.pm.containers(string(pod.UID)); len(got) != 0 {
		t.Fatalf("%s/%s is Pending, yet podman holds its containers %v", ns, name, got)
	}
	return pod
}

func containsAll(s string, subs []string) bool {
	for _, w := range subs {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// deletePods deletes the pods with nodeplugctl and waits until everything
// they held is freed: their containers gone; the claims made for them
// from templates deleted; a claim of their own (a ResourceClaim) no
// longer reserved nor allocated; every claim the driver held prepared
// unprepared by it, once, and its device metadata removed (a claim of a
// Pending pod, never prepared, is not unprepared).
func (f *featuresNode) deletePods(t *testing.T, pods ...*corev1.Pod) {
	t.Helper()
	type held struct {
		pod      *corev1.Pod
		claim    *resourcev1.ResourceClaim
		prepared bool
	}
	var hs []held
	args := []string{"delete", "pod"}
	state := f.d.readStateT(t)
	for _, p := range pods {
		c := f.claimOf(t, p)
		h := held{p, c, state.prepared(string(c.UID))}
		// What a prepared claim has on the host: the driver's CDI specs
		// (its env, and the mount of its metadata) and the metadata.
		if _, err := os.Stat(f.metadataDir(c)); h.prepared && err != nil {
			t.Fatalf("claim %s is prepared, yet its device metadata: %v", c.Name, err)
		}
		if specs := f.cdiSpecs(t, c); h.prepared && len(specs) != 2 {
			t.Fatalf("claim %s is prepared with the driver's CDI specs %v, want two (its env, its metadata)", c.Name, specs)
		}
		hs = append(hs, h)
		args = append(args, p.Namespace+"/"+p.Name)
	}
	t.Logf("$ nodeplugctl %s\n%s", strings.Join(args, " "), f.ctl(t, args...))
	for _, h := range hs {
		testutil.Eventually(t, fmt.Sprintf("pod %s/%s deleted and its claim %s freed", h.pod.Namespace, h.pod.Name, h.claim.Name), func() error {
			if _, err := f.pod(t, h.pod.Namespace, h.pod.Name); !apierrors.IsNotFound(err) {
				return fmt.Errorf("the pod: %v", err)
			}
			if err := f.pm.gone(string(h.pod.UID)); err != nil {
				return err
			}
			c, err := f.cs.ResourceV1().ResourceClaims(h.claim.Namespace).Get(ctxT(t), h.claim.Name, metav1.GetOptions{})
			fromTemplate := h.pod.Spec.ResourceClaims[0].ResourceClaimTemplateName != nil
			switch {
			case fromTemplate && !apierrors.IsNotFound(err):
				return fmt.Errorf("the claim made for the pod: %v", err)
			case !fromTemplate && err != nil:
				return err
			case !fromTemplate && (len(c.Status.ReservedFor) != 0 || c.Status.Allocation != nil):
				return fmt.Errorf("the pod's claim still reserved for %v, allocated %v", c.Status.ReservedFor, results(c))
			}
			if s := f.d.readStateT(t); s.prepared(string(h.claim.UID)) {
				return errors.New("the driver still holds the claim prepared")
			}
			if _, err := os.Stat(f.metadataDir(h.claim)); !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("the claim's device metadata left: %v", err)
			}
			if specs := f.cdiSpecs(t, h.claim); len(specs) != 0 {
				return fmt.Errorf("the claim's CDI specs left: %v", specs)
			}
			return nil
		})
		want := 0
		if h.prepared {
			want = 1
		}
		if n := f.d.readStateT(t).calls("NodeUnprepareResources", string(h.claim.UID)); n != want {
			t.Errorf("claim %s of pod %s/%s (prepared: %v) was unprepared %d times, want %d", h.claim.Name, h.pod.Namespace, h.pod.Name, h.prepared, n, want)
		}
	}
}

// metadataDir is where the driver keeps the device metadata of the claim
// (the helper's layout under the driver's data directory).
func (f *featuresNode) metadataDir(c *resourcev1.ResourceClaim) string {
	return filepath.Join(f.n.root, "plugins", featuresDriver, "dra-device-metadata", c.Namespace+"_"+c.Name)
}

// cdiSpecs are the driver's CDI spec files naming the claim's UID, in the
// CDI directory it was started with (its last --cdi-dir).
func (f *featuresNode) cdiSpecs(t *testing.T, c *resourcev1.ResourceClaim) []string {
	t.Helper()
	args := f.d.proc.Cmd.Args
	dir := ""
	for j := len(args) - 2; j >= 0; j-- {
		if args[j] == "--cdi-dir" {
			dir = args[j+1]
			break
		}
	}
	if dir == "" {
		t.Fatalf("the driver's command line %v names no CDI directory", args)
	}
	specs, err := filepath.Glob(filepath.Join(dir, "*"+string(c.UID)+"*"))
	if err != nil {
		t.Fatal(err)
	}
	return specs
}

// probePod is a pod in ns whose container main runs the probe until the
// pod is deleted, reporting the env variables envs and the driver's
// metadata of the pod's claim gpu: made from template, or, when template
// is empty, the ResourceClaim claim.
func probePod(ns, name, template, claim string, envs ...string) string {
	var args []string
	for _, e := range envs {
		args = append(args, fmt.Sprintf("%q", "-env"), fmt.Sprintf("%q", e))
	}
	args = append(args, `"-wait"`, fmt.Sprintf("%q", metadataPath(template, claim)))
	source := "resourceClaimTemplateName: " + template
	if template == "" {
		source = "resourceClaimName: " + claim
	}
	return fmt.Sprintf(`---
apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
spec:
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: %s
    command: ["/ctrprobe"]
    args: [%s]
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    %s
`, name, ns, podImage, strings.Join(args, ", "), source)
}

// template is a ResourceClaimTemplate in ns whose one request, gpu, is
// the YAML body (indented under the request).
func template(ns, name, body string) string {
	return fmt.Sprintf(`---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: %s
  namespace: %s
spec:
  spec:
    devices:
      requests:
      - name: gpu
%s`, name, ns, indent(body, "        "))
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = prefix + l
	}
	return strings.Join(lines, "\n") + "\n"
}

// model is a CEL selector of the driver's devices of one model.
func model(m string) string {
	return fmt.Sprintf(`device.attributes["%s"].model == "%s"`, featuresDriver, m)
}

// TestDRAPodFeatures: the manifests of each feature, run in podman on one
// node (each feature with devices of its own, so they do not interfere),
// each pod's container seeing in its device metadata exactly the devices
// the feature gives it, the pods that cannot have theirs Pending with the
// allocator's reason, and everything freed when the pods are deleted.
func TestDRAPodFeatures(t *testing.T) {
	f := startFeaturesNode(t)
	pool := f.n.node
	f.apply(t, "base.yaml", fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata:
  name: ml
---
apiVersion: v1
kind: Namespace
metadata:
  name: gpu-monitoring
  labels:
    resource.kubernetes.io/admin-access: "true"
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: %[1]s
spec:
  selectors:
  - cel:
      expression: device.driver == "%[1]s"
`, featuresDriver))
	// The rule that taints gpu-4 for the Taints case is applied first, so
	// that the allocator follows it well before a pod asks for gpu-4.
	f.apply(t, "maintenance.yaml", fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata:
  name: gpu-4-maintenance
spec:
  deviceSelector:
    driver: %s
    pool: %s
    device: gpu-4
  taint:
    key: %[1]s/maintenance
    value: firmware-update
    effect: NoSchedule
`, featuresDriver, pool))

	// Admin access: a monitoring pod in a namespace labelled for it gets
	// the device a training pod's ResourceClaim holds, without taking it
	// from it; in a namespace without the label the API refuses the
	// template, and nothing of the manifest is applied after it.
	t.Run("AdminAccess", func(t *testing.T) {
		f.apply(t, "trainer.yaml", fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: a100
  namespace: ml
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: %s
        selectors:
        - cel:
            expression: '%s'
`, featuresDriver, model("a100"))+probePod("ml", "trainer", "", "a100", "claim_a100_gpu"))
		trainer := f.running(t, "ml", "trainer")
		trainerClaim := f.claimOf(t, trainer)
		if got, want := results(trainerClaim), []string{"gpu " + pool + "/gpu-0"}; !slices.Equal(got, want) {
			t.Fatalf("claim a100 allocated %v, want %v", got, want)
		}

		admin := template("gpu-monitoring", "a100-admin", fmt.Sprintf(`exactly:
  deviceClassName: %s
  adminAccess: true
  selectors:
  - cel:
      expression: '%s'
`, featuresDriver, model("a100")))
		f.apply(t, "monitor.yaml", admin+probePod("gpu-monitoring", "dcgm-exporter", "a100-admin", ""))
		monitor := f.running(t, "gpu-monitoring", "dcgm-exporter")
		if got, want := f.seenDevices(t, monitor), []string{"gpu " + pool + "/gpu-0"}; !slices.Equal(got, want) {
			t.Errorf("the monitoring container sees %v, want %v", got, want)
		}
		mc := f.claimOf(t, monitor)
		if r := mc.Status.Allocation; r == nil || len(r.Devices.Results) != 1 || !ptr.Deref(r.Devices.Results[0].AdminAccess, false) {
			t.Errorf("the monitoring claim's allocation %+v, want gpu-0 with admin access", r)
		}
		// The trainer keeps its device.
		if c := f.claimOf(t, trainer); len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].UID != trainer.UID || !slices.Equal(results(c), results(trainerClaim)) {
			t.Errorf("claim a100 after the monitor's: reserved for %v, allocated %v", c.Status.ReservedFor, results(c))
		}
		if got, want := f.seenDevices(t, trainer), []string{"gpu " + pool + "/gpu-0"}; !slices.Equal(got, want) {
			t.Errorf("the training container sees %v, want %v", got, want)
		}
		// The driver's env edit for claim a100's request gpu.
		if v := f.report(t, trainer).Env["claim_a100_gpu"]; v == nil || *v != "true" {
			t.Errorf("claim_a100_gpu in the training container: %v, want true", ptrVal(v))
		}

		refused := strings.ReplaceAll(admin, "gpu-monitoring", "ml") + probePod("ml", "snoop", "a100-admin", "")
		path := filepath.Join(f.n.root, "snoop.yaml")
		writeFile(t, path, refused)
		out, err := f.ctlErr(t, "apply", "-f", path)
		t.Logf("$ nodeplugctl apply -f snoop.yaml\n%s%v", out, err)
		if err == nil || !strings.Contains(err.Error(), "adminAccess") || !strings.Contains(err.Error(), resourcev1.DRAAdminNamespaceLabelKey) {
			t.Errorf("applying an admin-access template in namespace ml: %v, want refused naming adminAccess and the label %s", err, resourcev1.DRAAdminNamespaceLabelKey)
		}
		if _, err := f.cs.ResourceV1().ResourceClaimTemplates("ml").Get(ctxT(t), "a100-admin", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the refused template: %v, want NotFound", err)
		}
		if _, err := f.pod(t, "ml", "snoop"); !apierrors.IsNotFound(err) {
			t.Errorf("the pod after the refused template: %v, want NotFound", err)
		}
		f.deletePods(t, monitor, trainer)
	})

	// A prioritized list: of three pods preferring an h100 and taking an
	// l4 otherwise, one gets the h100, one the l4 (each configured by the
	// config of its alternative), and the third neither, with both
	// alternatives in the reason.
	t.Run("FirstAvailable", func(t *testing.T) {
		manifest := template("ml", "best-gpu", fmt.Sprintf(`firstAvailable:
- name: large
  deviceClassName: %[1]s
  selectors:
  - cel:
      expression: '%[2]s'
- name: small
  deviceClassName: %[1]s
  selectors:
  - cel:
      expression: '%[3]s'
`, featuresDriver, model("h100"), model("l4")))
		manifest += fmt.Sprintf(`      config:
      - requests: ["gpu/large"]
        opaque:
          driver: %[1]s
          parameters:
            size: large
      - requests: ["gpu/small"]
        opaque:
          driver: %[1]s
          parameters:
            size: small
`, featuresDriver)
		names := []string{"infer-0", "infer-1", "infer-2"}
		for _, name := range names {
			manifest += probePod("ml", name, "best-gpu", "", "user_size")
		}
		f.apply(t, "infer.yaml", manifest)

		want := map[string]string{"large": "gpu/large " + pool + "/gpu-1", "small": "gpu/small " + pool + "/gpu-2"}
		run, waiting := f.twoRunOnePending(t, "ml", names)
		got := map[string]bool{}
		for _, p := range run {
			r := f.report(t, p)
			size := ptrVal(r.Env["user_size"])
			seen := f.seenDevices(t, p)
			s, _ := size.(string)
			if !slices.Equal(seen, []string{want[s]}) || !slices.Equal(results(f.claimOf(t, p)), seen) {
				t.Errorf("%s: user_size %v, sees %v, allocated %v; want an alternative's config and its device", p.Name, size, seen, results(f.claimOf(t, p)))
			}
			got[s] = true
		}
		if !got["large"] || !got["small"] {
			t.Errorf("the running pods got %v, want one of each alternative", got)
		}
		last := f.pending(t, "ml", waiting, `request "gpu/large"`, `request "gpu/small"`)
		f.deletePods(t, append(run, last)...)
	})

	// Taints: the driver taints gpu-3 (ECC errors), a DeviceTaintRule
	// gpu-4 (maintenance). A pod tolerating nothing stays Pending with
	// both devices free and tainted; a pod tolerating the maintenance then
	// gets gpu-4, never gpu-3, and the first pod stays Pending.
	t.Run("Taints", func(t *testing.T) {
		t4 := func(tolerations string) string {
			return fmt.Sprintf(`exactly:
  deviceClassName: %s
  selectors:
  - cel:
      expression: '%s'
%s`, featuresDriver, model("t4"), tolerations)
		}
		manifest := template("ml", "t4", t4("")) + template("ml", "t4-maintenance", t4(fmt.Sprintf(`  tolerations:
  - key: %s/maintenance
    operator: Exists
    effect: NoSchedule
`, featuresDriver)))
		f.apply(t, "inference.yaml", manifest+probePod("ml", "inference", "t4", ""))
		f.pending(t, "ml", "inference", `request "gpu"`, "2 of them free", "2 tainted")
		f.apply(t, "firmware-check.yaml", probePod("ml", "firmware-check", "t4-maintenance", ""))
		check := f.running(t, "ml", "firmware-check")
		if got, want := f.seenDevices(t, check), []string{"gpu " + pool + "/gpu-4"}; !slices.Equal(got, want) {
			t.Errorf("the container tolerating the maintenance sees %v, want %v", got, want)
		}
		plain := f.pending(t, "ml", "inference", `request "gpu"`, "1 of them free", "2 tainted")
		f.deletePods(t, check, plain)
		f.ctl(t, "delete", "-f", filepath.Join(f.n.root, "maintenance.yaml"))
	})

	// Partitionable devices: gpu-5 is one whole GPU or two halves, whose
	// memory counters they share. With one half in use the other half
	// fits and the whole GPU does not.
	t.Run("Partitions", func(t *testing.T) {
		a30 := func(profile string) string {
			return fmt.Sprintf(`exactly:
  deviceClassName: %s
  selectors:
  - cel:
      expression: '%[2]s && device.attributes["%[1]s"].profile == "%[3]s"'
`, featuresDriver, model("a30"), profile)
		}
		f.apply(t, "half-a.yaml", template("ml", "a30-half", a30("half"))+template("ml", "a30-full", a30("full"))+
			probePod("ml", "half-a", "a30-half", ""))
		halfA := f.running(t, "ml", "half-a")
		seenA := f.seenDevices(t, halfA)
		f.apply(t, "more.yaml", probePod("ml", "half-b", "a30-half", "")+probePod("ml", "whole", "a30-full", ""))
		halfB := f.running(t, "ml", "half-b")
		seenB := f.seenDevices(t, halfB)
		got := append(slices.Clone(seenA), seenB...)
		slices.Sort(got)
		if !slices.Equal(got, []string{"gpu " + pool + "/gpu-5-half-0", "gpu " + pool + "/gpu-5-half-1"}) {
			t.Errorf("the two half pods see %v and %v, want one half each", seenA, seenB)
		}
		whole := f.pending(t, "ml", "whole", `shared counter set "gpu-5-memory"`, `has 0 of counter "memory" left (of 24Gi), a device needs 24Gi`)
		f.deletePods(t, halfA, halfB, whole)
	})

	// Consumable capacity: gpu-6 is allocated to many claims, each a share
	// of its 24Gi of memory: two pods asking 12Gi each share it, a third
	// finds it full.
	t.Run("ConsumableCapacity", func(t *testing.T) {
		manifest := template("ml", "a10-12gi", fmt.Sprintf(`exactly:
  deviceClassName: %s
  selectors:
  - cel:
      expression: '%s'
  capacity:
    requests:
      memory: 12Gi
`, featuresDriver, model("a10")))
		names := []string{"share-0", "share-1", "share-2"}
		for _, name := range names {
			manifest += probePod("ml", name, "a10-12gi", "")
		}
		f.apply(t, "shares.yaml", manifest)
		run, waiting := f.twoRunOnePending(t, "ml", names)
		shares := map[string]bool{}
		for _, p := range run {
			if got, want := f.seenDevices(t, p), []string{"gpu " + pool + "/gpu-6"}; !slices.Equal(got, want) {
				t.Errorf("%s sees %v, want %v", p.Name, got, want)
			}
			c := f.claimOf(t, p)
			res := c.Status.Allocation.Devices.Results
			if len(res) != 1 || res[0].ShareID == nil {
				t.Errorf("%s's claim allocated %+v, want a share of gpu-6", p.Name, res)
				continue
			}
			if used := res[0].ConsumedCapacity["memory"]; used.Cmp(resource.MustParse("12Gi")) != 0 {
				t.Errorf("%s's claim allocated %+v, want a share of gpu-6 consuming 12Gi", p.Name, res)
				continue
			}
			shares[string(*res[0].ShareID)] = true
		}
		if len(shares) != 2 {
			t.Errorf("the two claims have shares %v, want two distinct", shares)
		}
		last := f.pending(t, "ml", waiting, `capacity "memory" of device `+featuresDriver+"/"+pool+"/gpu-6: 24Gi of 24Gi in use, the request needs 12Gi")
		t.Logf("$ nodeplugctl pods\n%s", f.ctl(t, "pods"))
		f.deletePods(t, append(run, last)...)
	})
}
