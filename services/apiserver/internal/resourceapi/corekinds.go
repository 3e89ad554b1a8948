package resourceapi

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The core/v1 kinds a Pod's devices need on one node: Namespaces, Pods
// and Events. As for the resource kinds, the validation is a sound subset
// of the API server's (k8s.io/kubernetes/pkg/apis/core/validation): what a
// manifest most often gets wrong, and what nodeplug reads.

// podFields are the field selectors kube-apiserver supports on Pods.
func podFields(o runtime.Object) fields.Set {
	p := o.(*corev1.Pod)
	podIPs := make([]string, 0, len(p.Status.PodIPs))
	for _, ip := range p.Status.PodIPs {
		podIPs = append(podIPs, ip.IP)
	}
	return fields.Set{
		"metadata.name":            p.Name,
		"metadata.namespace":       p.Namespace,
		"spec.nodeName":            p.Spec.NodeName,
		"spec.restartPolicy":       string(p.Spec.RestartPolicy),
		"spec.schedulerName":       p.Spec.SchedulerName,
		"spec.serviceAccountName":  p.Spec.ServiceAccountName,
		"spec.hostNetwork":         fmt.Sprint(p.Spec.HostNetwork),
		"status.phase":             string(p.Status.Phase),
		"status.podIP":             p.Status.PodIP,
		"status.podIPs":            strings.Join(podIPs, ","),
		"status.nominatedNodeName": p.Status.NominatedNodeName,
	}
}

// eventFields are the field selectors kube-apiserver supports on Events
// (kubectl describe selects a pod's events by involvedObject).
func eventFields(o runtime.Object) fields.Set {
	e := o.(*corev1.Event)
	return fields.Set{
		"metadata.name":                  e.Name,
		"metadata.namespace":             e.Namespace,
		"involvedObject.kind":            e.InvolvedObject.Kind,
		"involvedObject.namespace":       e.InvolvedObject.Namespace,
		"involvedObject.name":            e.InvolvedObject.Name,
		"involvedObject.uid":             string(e.InvolvedObject.UID),
		"involvedObject.apiVersion":      e.InvolvedObject.APIVersion,
		"involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath":       e.InvolvedObject.FieldPath,
		"reason":                         e.Reason,
		"reportingComponent":             e.ReportingController,
		"source":                         e.Source.Component,
		"type":                           e.Type,
	}
}

// undeletableNamespaces may not be deleted, as in kube-apiserver.
var undeletableNamespaces = []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic}

// initialNamespaces exist from the start, as in a new cluster.
var initialNamespaces = []string{metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic, corev1.NamespaceNodeLease}

// validateNamespace: the name is a DNS label; the finalizers are
// qualified names.
func validateNamespace(obj, _ runtime.Object) field.ErrorList {
	n := obj.(*corev1.Namespace)
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(n.Name) {
		errs = append(errs, field.Invalid(field.NewPath("metadata", "name"), n.Name, msg))
	}
	for i, f := range n.Spec.Finalizers {
		errs = append(errs, validateQualifiedName(string(f), field.NewPath("spec", "finalizers").Index(i))...)
	}
	return errs
}

// validatePod: at least one container; every container named by a DNS
// label unique in the pod, with an image; a known restart policy; pod
// claims named once, each naming exactly one claim or template; the
// claims a container lists are the pod's. An update may change only what
// kube-apiserver lets change on a running pod.
func validatePod(obj, old runtime.Object) field.ErrorList {
	p := obj.(*corev1.Pod)
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if len(p.Spec.Containers) == 0 {
		errs = append(errs, field.Required(spec.Child("containers"), ""))
	}
	claims := map[string]bool{}
	for i, c := range p.Spec.ResourceClaims {
		cp := spec.Child("resourceClaims").Index(i)
		errs = append(errs, validateRequestName(c.Name, claims, cp.Child("name"))...)
		switch {
		case (c.ResourceClaimName == nil) == (c.ResourceClaimTemplateName == nil):
			errs = append(errs, field.Invalid(cp, c.Name, "must specify exactly one of resourceClaimName and resourceClaimTemplateName"))
		case c.ResourceClaimName != nil:
			errs = append(errs, validateObjectName(*c.ResourceClaimName, cp.Child("resourceClaimName"))...)
		default:
			errs = append(errs, validateObjectName(*c.ResourceClaimTemplateName, cp.Child("resourceClaimTemplateName"))...)
		}
	}
	names := map[string]bool{}
	validate := func(cs []corev1.Container, p *field.Path) {
		for i, c := range cs {
			cp := p.Index(i)
			errs = append(errs, validateRequestName(c.Name, names, cp.Child("name"))...)
			if strings.TrimSpace(c.Image) == "" {
				errs = append(errs, field.Required(cp.Child("image"), ""))
			}
			used := map[string]bool{}
			for j, rc := range c.Resources.Claims {
				rp := cp.Child("resources", "claims").Index(j)
				if !claims[rc.Name] {
					errs = append(errs, field.NotFound(rp.Child("name"), rc.Name))
				}
				if id := rc.Name + "/" + rc.Request; used[id] {
					errs = append(errs, field.Duplicate(rp, id))
				} else {
					used[id] = true
				}
			}
			switch c.ImagePullPolicy {
			case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
			default:
				errs = append(errs, field.NotSupported(cp.Child("imagePullPolicy"), c.ImagePullPolicy,
					[]corev1.PullPolicy{corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever}))
			}
		}
	}
	validate(p.Spec.InitContainers, spec.Child("initContainers"))
	validate(p.Spec.Containers, spec.Child("containers"))
	if len(p.Spec.EphemeralContainers) > 0 && old == nil {
		errs = append(errs, field.Forbidden(spec.Child("ephemeralContainers"), "cannot be set on create"))
	}
	switch p.Spec.RestartPolicy {
	case corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever:
	default:
		errs = append(errs, field.NotSupported(spec.Child("restartPolicy"), p.Spec.RestartPolicy,
			[]corev1.RestartPolicy{corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever}))
	}
	if n := p.Spec.NodeName; n != "" {
		for _, msg := range validation.IsDNS1123Subdomain(n) {
			errs = append(errs, field.Invalid(spec.Child("nodeName"), n, msg))
		}
	}
	if o, ok := old.(*corev1.Pod); ok && !podSpecUpdateAllowed(&o.Spec, &p.Spec) {
		errs = append(errs, field.Forbidden(spec, "pod updates may not change fields other than "+
			"`spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, "+
			"`spec.tolerations` (only additions to existing tolerations), `spec.schedulingGates` (only removals) "+
			"and `spec.nodeName` (only set once)"))
	}
	return errs
}

// podSpecUpdateAllowed: the new spec differs from the old one only where
// a pod may change once created.
func podSpecUpdateAllowed(old, cur *corev1.PodSpec) bool {
	o := old.DeepCopy()
	if len(o.Containers) == len(cur.Containers) {
		for i := range o.Containers {
			o.Containers[i].Image = cur.Containers[i].Image
		}
	}
	if len(o.InitContainers) == len(cur.InitContainers) {
		for i := range o.InitContainers {
			o.InitContainers[i].Image = cur.InitContainers[i].Image
		}
	}
	o.ActiveDeadlineSeconds = cur.ActiveDeadlineSeconds
	if len(cur.Tolerations) >= len(o.Tolerations) && apiequality.Semantic.DeepEqual(o.Tolerations, cur.Tolerations[:len(o.Tolerations)]) {
		o.Tolerations = cur.Tolerations
	}
	if len(cur.SchedulingGates) <= len(o.SchedulingGates) {
		o.SchedulingGates = cur.SchedulingGates
	}
	if o.NodeName == "" {
		o.NodeName = cur.NodeName
	}
	o.EphemeralContainers = cur.EphemeralContainers
	return apiequality.Semantic.DeepEqual(o, cur)
}

// validateEvent: the object an event is about is in the event's own
// namespace (or, for a cluster-scoped object, in any); its type, when
// set, is Normal or Warning.
func validateEvent(obj, _ runtime.Object) field.ErrorList {
	e := obj.(*corev1.Event)
	var errs field.ErrorList
	if ns := e.InvolvedObject.Namespace; ns != "" && ns != e.Namespace {
		errs = append(errs, field.Invalid(field.NewPath("involvedObject", "namespace"), ns, "does not match event.namespace"))
	}
	switch e.Type {
	case "", corev1.EventTypeNormal, corev1.EventTypeWarning:
	default:
		errs = append(errs, field.NotSupported(field.NewPath("type"), e.Type, []string{corev1.EventTypeNormal, corev1.EventTypeWarning}))
	}
	if len(e.Reason) > 128 {
		errs = append(errs, field.TooLong(field.NewPath("reason"), "", 128))
	}
	return errs
}

// validateObjectName: a DNS subdomain, as object names are.
func validateObjectName(name string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

// defaultPod sets what kube-apiserver defaults on a Pod and the
// containers nodeplug runs (k8s.io/kubernetes/pkg/apis/core/v1's
// SetDefaults_Pod and SetDefaults_Container, their fields a runtime
// reads).
func defaultPod(p *corev1.Pod) {
	s := &p.Spec
	if s.RestartPolicy == "" {
		s.RestartPolicy = corev1.RestartPolicyAlways
	}
	if s.DNSPolicy == "" {
		s.DNSPolicy = corev1.DNSClusterFirst
	}
	if s.SchedulerName == "" {
		s.SchedulerName = corev1.DefaultSchedulerName
	}
	if s.TerminationGracePeriodSeconds == nil {
		grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
		s.TerminationGracePeriodSeconds = &grace
	}
	if s.SecurityContext == nil {
		s.SecurityContext = &corev1.PodSecurityContext{}
	}
	if s.EnableServiceLinks == nil {
		on := corev1.DefaultEnableServiceLinks
		s.EnableServiceLinks = &on
	}
	for _, cs := range [][]corev1.Container{s.InitContainers, s.Containers} {
		for i := range cs {
			defaultContainer(&cs[i])
		}
	}
}

func defaultContainer(c *corev1.Container) {
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = defaultPullPolicy(c.Image)
	}
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = corev1.TerminationMessagePathDefault
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = corev1.ProtocolTCP
		}
	}
}

// defaultPullPolicy is the kubelet's rule: Always for an image with no
// tag or the tag latest (and no digest), IfNotPresent otherwise.
func defaultPullPolicy(image string) corev1.PullPolicy {
	if strings.Contains(image, "@") {
		return corev1.PullIfNotPresent
	}
	name := image
	if i := strings.LastIndex(name, "/"); i >= 0 {
		name = name[i+1:]
	}
	tag := ""
	if i := strings.LastIndex(name, ":"); i >= 0 {
		tag = name[i+1:]
	}
	if tag == "" || tag == "latest" {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

// validateClaimTemplate: the claim spec it stamps out is a sound claim
// spec; it may not change once created.
func validateClaimTemplate(obj, old runtime.Object) field.ErrorList {
	t := obj.(*resourcev1.ResourceClaimTemplate)
	errs := validateClaimSpec(&t.Spec.Spec, field.NewPath("spec", "spec"))
	if o, ok := old.(*resourcev1.ResourceClaimTemplate); ok && !apiequality.Semantic.DeepEqual(o.Spec, t.Spec) {
		errs = append(errs, field.Invalid(field.NewPath("spec"), "", "field is immutable"))
	}
	return errs
}

// validateTaintRule: a taint with a qualified key, a label value and a
// known effect; a selector's driver is a driver name; at most 8
// conditions.
func validateTaintRule(obj, _ runtime.Object) field.ErrorList {
	r := obj.(*resourcev1.DeviceTaintRule)
	p := field.NewPath("spec", "taint")
	var errs field.ErrorList
	if r.Spec.Taint.Key == "" {
		errs = append(errs, field.Required(p.Child("key"), ""))
	} else {
		errs = append(errs, validateQualifiedName(r.Spec.Taint.Key, p.Child("key"))...)
	}
	for _, msg := range validation.IsValidLabelValue(r.Spec.Taint.Value) {
		errs = append(errs, field.Invalid(p.Child("value"), r.Spec.Taint.Value, msg))
	}
	switch r.Spec.Taint.Effect {
	case resourcev1.DeviceTaintEffectNone, resourcev1.DeviceTaintEffectNoSchedule, resourcev1.DeviceTaintEffectNoExecute:
	case "":
		errs = append(errs, field.Required(p.Child("effect"), ""))
	default:
		errs = append(errs, field.NotSupported(p.Child("effect"), r.Spec.Taint.Effect, []resourcev1.DeviceTaintEffect{
			resourcev1.DeviceTaintEffectNone, resourcev1.DeviceTaintEffectNoSchedule, resourcev1.DeviceTaintEffectNoExecute}))
	}
	if sel := r.Spec.DeviceSelector; sel != nil && sel.Driver != nil {
		errs = append(errs, validateDriverName(*sel.Driver, field.NewPath("spec", "deviceSelector", "driver"))...)
	}
	if n := len(r.Status.Conditions); n > resourcev1.DeviceTaintRuleStatusMaxConditions {
		errs = append(errs, field.TooMany(field.NewPath("status", "conditions"), n, resourcev1.DeviceTaintRuleStatusMaxConditions))
	}
	return errs
}
