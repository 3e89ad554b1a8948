package podworker

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/podinfo"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

// DRA extended resources, as the scheduler and the kubelet handle them
// (KEP-5004). A container's resources.limits entry is one when a
// DeviceClass stands for its name:
//
//   - deviceclass.resource.kubernetes.io/<class>, the class's implicit
//     name, always;
//   - a class's spec.extendedResourceName, when no device plugin of the
//     node serves that name (a device plugin's resource wins, as the
//     node's allocatable wins in the scheduler). Of two classes naming
//     it, the newer is taken (the name breaks a tie), as the scheduler's
//     extended-resource cache takes it.
//
// The pod's DRA extended resources are allocated through one claim made
// for it: generated name <pod>-extended-resources-, the pod as
// controlling owner, the extended-resource-claim annotation, one request
// container-<i>-request-<j> for the j-th such resource (by name) of the
// i-th container (init containers first) with the class and the count.
// The pod's status.extendedResourceClaimStatus names the claim and maps
// each container's resource to its request; its containers get the CDI
// devices of their requests. The claim is deleted with the pod, as the
// claims made from templates are.

// extendedRequest is one container's DRA extended resource.
type extendedRequest struct {
	container, resource, class, request string
	count                               int64
}

// extendedClaim is the pod's extended-resource claim.
type extendedClaim struct {
	name     string
	mappings []corev1.ContainerExtendedResourceRequest
}

// dra says whether the container's resource is one of the claim's.
func (x *extendedClaim) dra(container, resource string) bool {
	if x == nil {
		return false
	}
	for _, m := range x.mappings {
		if m.ContainerName == container && m.ResourceName == resource {
			return true
		}
	}
	return false
}

// devicePluginPod is pod without the limits its extended-resource claim
// serves: what is left is the device plugins'.
func (x *extendedClaim) devicePluginPod(pod *corev1.Pod) *corev1.Pod {
	if x == nil {
		return pod
	}
	out := pod.DeepCopy()
	for _, cs := range [][]corev1.Container{out.Spec.InitContainers, out.Spec.Containers} {
		for i := range cs {
			for name := range cs[i].Resources.Limits {
				if x.dra(cs[i].Name, string(name)) {
					delete(cs[i].Resources.Limits, name)
				}
			}
		}
	}
	return out
}

// addTo adds the claim to a prepare request: a pod claim under a name
// none of the pod's own has (podinfo.ExtendedClaimName, as nodeplugctl
// and the console show it), and each container's requests.
func (x *extendedClaim) addTo(pod *corev1.Pod, req *claims.PrepareRequest) {
	name := podinfo.ExtendedClaimName(pod)
	req.PodClaims = append(req.PodClaims, claims.PodClaim{Name: name, ResourceClaimName: x.name})
	for i := range req.Containers {
		for _, m := range x.mappings {
			if m.ContainerName == req.Containers[i].Container {
				req.Containers[i].Claims = append(req.Containers[i].Claims, claims.ContainerClaim{Name: name, Request: m.RequestName})
			}
		}
	}
}

// extendedResources are the pod's DRA extended resources, in request
// order. A name of the implicit form whose class does not exist is an
// error (the pod cannot be scheduled).
func (w *Worker) extendedResources(ctx context.Context, pod *corev1.Pod) ([]extendedRequest, error) {
	var candidates bool
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range cs {
			for name := range c.Resources.Limits {
				candidates = candidates || !native(name)
			}
		}
	}
	if !candidates {
		return nil, nil
	}
	classes, err := w.cfg.Client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing the device classes: %w", err)
	}
	explicit, implicit := classIndex(classes.Items)
	// The device plugins' resources are asked for only when a class
	// names one of the limits.
	var served map[string]bool
	servedByPlugin := func(name string) (bool, error) {
		if served == nil && w.cfg.Devices != nil {
			if served, err = w.cfg.Devices.Resources(ctx); err != nil {
				return false, err
			}
		}
		return served[name], nil
	}
	var out []extendedRequest
	for i, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		j := 0
		for _, name := range slices.Sorted(maps.Keys(c.Resources.Limits)) {
			q := c.Resources.Limits[name]
			if native(name) || q.Value() <= 0 {
				continue
			}
			class := ""
			switch n := string(name); {
			case strings.HasPrefix(n, DRAExtendedResourcePrefix):
				if !implicit[strings.TrimPrefix(n, DRAExtendedResourcePrefix)] {
					return nil, fmt.Errorf("container %s: resources.limits[%s]: there is no DeviceClass %s: %w",
						c.Name, n, strings.TrimPrefix(n, DRAExtendedResourcePrefix), errdefs.ErrFailedPrecondition)
				}
				class = strings.TrimPrefix(n, DRAExtendedResourcePrefix)
			case explicit[n] != "":
				plugin, err := servedByPlugin(n)
				if err != nil {
					return nil, err
				}
				if plugin {
					continue
				}
				class = explicit[n]
			default:
				continue
			}
			out = append(out, extendedRequest{container: c.Name, resource: string(name), class: class,
				request: fmt.Sprintf("container-%d-request-%d", i, j), count: q.Value()})
			j++
		}
	}
	return out, nil
}

// classIndex maps each extendedResourceName to the class that serves it
// (the newest; the lower name on a tie) and says which classes exist.
func classIndex(classes []resourcev1.DeviceClass) (explicit map[string]string, exists map[string]bool) {
	explicit, exists = map[string]string{}, map[string]bool{}
	newest := map[string]*resourcev1.DeviceClass{}
	for i := range classes {
		dc := &classes[i]
		exists[dc.Name] = true
		n := ptr.Deref(dc.Spec.ExtendedResourceName, "")
		if n == "" {
			continue
		}
		if cur := newest[n]; cur != nil {
			switch t := dc.CreationTimestamp.Compare(cur.CreationTimestamp.Time); {
			case t < 0, t == 0 && dc.Name >= cur.Name:
				continue
			}
		}
		newest[n] = dc
		explicit[n] = dc.Name
	}
	return explicit, exists
}

// claimSpec is the spec of the claim for reqs.
func claimSpec(reqs []extendedRequest) resourcev1.ResourceClaimSpec {
	var spec resourcev1.ResourceClaimSpec
	for _, r := range reqs {
		spec.Devices.Requests = append(spec.Devices.Requests, resourcev1.DeviceRequest{Name: r.request,
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: r.class,
				AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: r.count}})
	}
	return spec
}

// extendedClaimOf returns the pod's extended-resource claim, making it
// when the pod has DRA extended resources and no claim yet, and records
// it in the pod's status; nil when the pod has none. A pod's status names
// its claim once it is made: that is what is used afterwards, as the
// kubelet uses it.
func (w *Worker) extendedClaimOf(ctx context.Context, pod *corev1.Pod) (*extendedClaim, error) {
	if st := pod.Status.ExtendedResourceClaimStatus; st != nil {
		return &extendedClaim{name: st.ResourceClaimName, mappings: st.RequestMappings}, nil
	}
	reqs, err := w.extendedResources(ctx, pod)
	if err != nil || len(reqs) == 0 {
		return nil, err
	}
	name, err := w.makeExtendedClaim(ctx, pod, claimSpec(reqs))
	if err != nil {
		return nil, err
	}
	x := &extendedClaim{name: name}
	for _, r := range reqs {
		x.mappings = append(x.mappings, corev1.ContainerExtendedResourceRequest{ContainerName: r.container, ResourceName: r.resource, RequestName: r.request})
	}
	status := &corev1.PodExtendedResourceClaimStatus{ResourceClaimName: name, RequestMappings: x.mappings}
	if err := w.updateStatus(ctx, pod, func(st *corev1.PodStatus) { st.ExtendedResourceClaimStatus = status }); err != nil {
		return nil, err
	}
	return x, nil
}

// makeExtendedClaim returns the name of the pod's extended-resource
// claim with spec: one made before (a crash may have come between its
// creation and the pod's status; one made with another spec, as classes
// or device plugins changed meanwhile, is deleted: nothing used it) or a
// new one.
func (w *Worker) makeExtendedClaim(ctx context.Context, pod *corev1.Pod, spec resourcev1.ResourceClaimSpec) (string, error) {
	api := w.cfg.Client.ResourceV1().ResourceClaims(pod.Namespace)
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("listing the claims of namespace %s: %w", pod.Namespace, err)
	}
	for _, c := range list.Items {
		if c.Annotations[resourcev1.ExtendedResourceClaimAnnotation] != "true" || !ownedBy(&c, pod.UID) {
			continue
		}
		if apiequality.Semantic.DeepEqual(c.Spec, spec) {
			return c.Name, nil
		}
		err := api.Delete(ctx, c.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &c.UID}})
		if err != nil && !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("deleting the outdated extended-resource claim %s/%s: %w", c.Namespace, c.Name, err)
		}
	}
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: generateName(pod.Name, "extended-resources"),
			Namespace:    pod.Namespace,
			Annotations:  map[string]string{resourcev1.ExtendedResourceClaimAnnotation: "true"},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: spec,
	}
	made, err := api.Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating the claim of the pod's DRA extended resources: %w", err)
	}
	w.log.Info("claim made for DRA extended resources", "pod", pod.Namespace+"/"+pod.Name, "claim", made.Name, "requests", len(spec.Devices.Requests))
	return made.Name, nil
}

// Resources are the devicemanager's resources: those of a registered
// device plugin, or within its grace period.
func (d *grpcDevices) Resources(ctx context.Context) (map[string]bool, error) {
	resp, err := d.dm.ListResources(ctx, &dmv1.ListResourcesRequest{})
	if err != nil {
		return nil, d.wrap("ListResources", err)
	}
	out := make(map[string]bool, len(resp.GetResources()))
	for _, r := range resp.GetResources() {
		out[r.GetName()] = true
	}
	return out, nil
}
