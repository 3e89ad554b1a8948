package resourceapi

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	apivalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// The validation here is a sound subset of the API server's (whose full
// rules live in k8s.io/kubernetes internal packages): object names, the
// required spec fields and their formats, list bounds, device names and
// attributes, request counts, and the fields that may not change. CEL
// selectors are not compiled, and the feature-gated fields (counters,
// taints, binding conditions) are only bounded in size.

// validateMeta is the API server's own validation of an object's
// metadata (k8s.io/apimachinery's): the name (a DNS subdomain), the
// namespace (a DNS label, only for namespaced kinds), generateName, the
// labels (keys and values), the annotations (keys, and 256 KiB in total),
// the owner references and the finalizers. A failure is 422 Invalid.
func validateMeta(k *kind, obj runtime.Object) field.ErrorList {
	m, err := meta.Accessor(obj)
	if err != nil {
		return field.ErrorList{field.InternalError(field.NewPath("metadata"), err)}
	}
	return apivalidation.ValidateObjectMetaAccessor(m, k.namespaced, apivalidation.NameIsDNSSubdomain, field.NewPath("metadata"))
}

// validateSlice: driver, pool, exactly one node selection, the devices.
func validateSlice(obj, old runtime.Object) field.ErrorList {
	s := obj.(*resourcev1.ResourceSlice)
	p := field.NewPath("spec")
	var errs field.ErrorList
	errs = append(errs, validateDriverName(s.Spec.Driver, p.Child("driver"))...)
	errs = append(errs, validatePool(s.Spec.Pool, p.Child("pool"))...)
	set := 0
	if s.Spec.NodeName != nil {
		set++
		for _, msg := range validation.IsDNS1123Subdomain(*s.Spec.NodeName) {
			errs = append(errs, field.Invalid(p.Child("nodeName"), *s.Spec.NodeName, msg))
		}
	}
	if s.Spec.NodeSelector != nil {
		set++
	}
	if s.Spec.AllNodes != nil {
		set++
		if !*s.Spec.AllNodes {
			errs = append(errs, field.Invalid(p.Child("allNodes"), false, "must be true when set"))
		}
	}
	if s.Spec.PerDeviceNodeSelection != nil {
		set++
	}
	if set != 1 {
		errs = append(errs, field.Invalid(p, "{nodeName, nodeSelector, allNodes, perDeviceNodeSelection}",
			"exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"))
	}
	errs = append(errs, validateDevices(s.Spec.Devices, p.Child("devices"))...)
	if len(s.Spec.SharedCounters) > resourcev1.ResourceSliceMaxCounterSets {
		errs = append(errs, field.TooMany(p.Child("sharedCounters"), len(s.Spec.SharedCounters), resourcev1.ResourceSliceMaxCounterSets))
	}
	if o, ok := old.(*resourcev1.ResourceSlice); ok {
		if o.Spec.Driver != s.Spec.Driver {
			errs = append(errs, field.Invalid(p.Child("driver"), s.Spec.Driver, "field is immutable"))
		}
		if !apiequality.Semantic.DeepEqual(o.Spec.NodeName, s.Spec.NodeName) {
			errs = append(errs, field.Invalid(p.Child("nodeName"), nodeNameOf(s), "field is immutable"))
		}
	}
	return errs
}

// validateDriverName: a DNS subdomain of at most 63 bytes, as upstream.
func validateDriverName(name string, p *field.Path) field.ErrorList {
	if name == "" {
		return field.ErrorList{field.Required(p, "")}
	}
	var errs field.ErrorList
	if len(name) > resourcev1.DriverNameMaxLength {
		errs = append(errs, field.TooLong(p, "", resourcev1.DriverNameMaxLength))
	}
	for _, msg := range validation.IsDNS1123Subdomain(strings.ToLower(name)) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	return errs
}

// validatePool: a name of DNS subdomains separated by '/', a generation
// that is not negative, at least one slice.
func validatePool(pool resourcev1.ResourcePool, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if pool.Name == "" {
		errs = append(errs, field.Required(p.Child("name"), ""))
	} else {
		if len(pool.Name) > resourcev1.PoolNameMaxLength {
			errs = append(errs, field.TooLong(p.Child("name"), "", resourcev1.PoolNameMaxLength))
		}
		for _, part := range strings.Split(pool.Name, "/") {
			for _, msg := range validation.IsDNS1123Subdomain(part) {
				errs = append(errs, field.Invalid(p.Child("name"), pool.Name, msg))
			}
		}
	}
	if pool.Generation < 0 {
		errs = append(errs, field.Invalid(p.Child("generation"), pool.Generation, "must be greater than or equal to 0"))
	}
	if pool.ResourceSliceCount <= 0 {
		errs = append(errs, field.Invalid(p.Child("resourceSliceCount"), pool.ResourceSliceCount, "must be greater than 0"))
	}
	return errs
}

// validateDevices: at most 128, each named by a unique DNS label, each
// attribute and capacity with a qualified name, each attribute with
// exactly one value.
func validateDevices(devices []resourcev1.Device, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(devices) > resourcev1.ResourceSliceMaxDevices {
		errs = append(errs, field.TooMany(p, len(devices), resourcev1.ResourceSliceMaxDevices))
	}
	seen := map[string]bool{}
	for i, d := range devices {
		dp := p.Index(i)
		if d.Name == "" {
			errs = append(errs, field.Required(dp.Child("name"), ""))
		}
		for _, msg := range validation.IsDNS1123Label(d.Name) {
			errs = append(errs, field.Invalid(dp.Child("name"), d.Name, msg))
		}
		if seen[d.Name] {
			errs = append(errs, field.Duplicate(dp.Child("name"), d.Name))
		}
		seen[d.Name] = true
		if n := len(d.Attributes) + len(d.Capacity); n > resourcev1.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
			errs = append(errs, field.TooMany(dp, n, resourcev1.ResourceSliceMaxAttributesAndCapacitiesPerDevice))
		}
		for name, a := range d.Attributes {
			ap := dp.Child("attributes").Key(string(name))
			errs = append(errs, validateQualifiedName(string(name), ap)...)
			errs = append(errs, validateAttribute(a, ap)...)
		}
		for name := range d.Capacity {
			errs = append(errs, validateQualifiedName(string(name), dp.Child("capacity").Key(string(name)))...)
		}
	}
	return errs
}

// validateQualifiedName: an optional domain (a DNS subdomain of at most
// 63 bytes), '/', and a C identifier of at most 32 bytes.
func validateQualifiedName(name string, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	domain, id, found := strings.Cut(name, "/")
	if !found {
		id, domain = domain, ""
	}
	if found {
		// The domain is held to a driver name's rules, as upstream does.
		errs = append(errs, validateDriverName(domain, p)...)
	}
	if id == "" {
		errs = append(errs, field.Required(p, "the name after the domain"))
	} else {
		for _, msg := range validation.IsCIdentifier(id) {
			errs = append(errs, field.Invalid(p, name, msg))
		}
		if len(id) > resourcev1.DeviceMaxIDLength {
			errs = append(errs, field.TooLong(p, "", resourcev1.DeviceMaxIDLength))
		}
	}
	return errs
}

func validateAttribute(a resourcev1.DeviceAttribute, p *field.Path) field.ErrorList {
	n := 0
	for _, set := range []bool{a.IntValue != nil, a.BoolValue != nil, a.StringValue != nil, a.VersionValue != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return field.ErrorList{field.Invalid(p, "", "exactly one value must be specified")}
	}
	if a.StringValue != nil && len(*a.StringValue) > resourcev1.DeviceAttributeMaxValueLength {
		return field.ErrorList{field.TooLong(p.Child("string"), "", resourcev1.DeviceAttributeMaxValueLength)}
	}
	return nil
}

// validateClaim: a sound claim spec (validateClaimSpec), which may not
// change after creation, and a bounded reservedFor.
func validateClaim(obj, old runtime.Object) field.ErrorList {
	c := obj.(*resourcev1.ResourceClaim)
	errs := validateClaimSpec(&c.Spec, field.NewPath("spec"))
	if o, ok := old.(*resourcev1.ResourceClaim); ok && !apiequality.Semantic.DeepEqual(o.Spec, c.Spec) {
		errs = append(errs, field.Invalid(field.NewPath("spec"), "", "field is immutable"))
	}
	if n := len(c.Status.ReservedFor); n > resourcev1.ResourceClaimReservedForMaxSize {
		errs = append(errs, field.TooMany(field.NewPath("status", "reservedFor"), n, resourcev1.ResourceClaimReservedForMaxSize))
	}
	return errs
}

// validateClaimSpec: requests named by unique DNS labels, each with
// exactly one of exactly / firstAvailable, a device class and a sound
// count.
func validateClaimSpec(spec *resourcev1.ResourceClaimSpec, at *field.Path) field.ErrorList {
	p := at.Child("devices", "requests")
	var errs field.ErrorList
	if n := len(spec.Devices.Requests); n > resourcev1.DeviceRequestsMaxSize {
		errs = append(errs, field.TooMany(p, n, resourcev1.DeviceRequestsMaxSize))
	}
	seen := map[string]bool{}
	for i, r := range spec.Devices.Requests {
		rp := p.Index(i)
		errs = append(errs, validateRequestName(r.Name, seen, rp.Child("name"))...)
		switch {
		case r.Exactly != nil && len(r.FirstAvailable) > 0, r.Exactly == nil && len(r.FirstAvailable) == 0:
			errs = append(errs, field.Invalid(rp, "", "exactly one of `exactly` or `firstAvailable` is required"))
		case r.Exactly != nil:
			e := r.Exactly
			errs = append(errs, validateCount(e.DeviceClassName, e.AllocationMode, e.Count, rp.Child("exactly"))...)
		default:
			if len(r.FirstAvailable) > resourcev1.FirstAvailableDeviceRequestMaxSize {
				errs = append(errs, field.TooMany(rp.Child("firstAvailable"), len(r.FirstAvailable), resourcev1.FirstAvailableDeviceRequestMaxSize))
			}
			subSeen := map[string]bool{}
			for j, sr := range r.FirstAvailable {
				sp := rp.Child("firstAvailable").Index(j)
				errs = append(errs, validateRequestName(sr.Name, subSeen, sp.Child("name"))...)
				errs = append(errs, validateCount(sr.DeviceClassName, sr.AllocationMode, sr.Count, sp)...)
			}
		}
	}
	return errs
}

func validateRequestName(name string, seen map[string]bool, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if name == "" {
		errs = append(errs, field.Required(p, ""))
	}
	for _, msg := range validation.IsDNS1123Label(name) {
		errs = append(errs, field.Invalid(p, name, msg))
	}
	if seen[name] {
		errs = append(errs, field.Duplicate(p, name))
	}
	seen[name] = true
	return errs
}

func validateCount(class string, mode resourcev1.DeviceAllocationMode, count int64, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if class == "" {
		errs = append(errs, field.Required(p.Child("deviceClassName"), ""))
	}
	for _, msg := range validation.IsDNS1123Subdomain(class) {
		errs = append(errs, field.Invalid(p.Child("deviceClassName"), class, msg))
	}
	switch mode {
	case resourcev1.DeviceAllocationModeExactCount:
		if count <= 0 {
			errs = append(errs, field.Invalid(p.Child("count"), count, "must be greater than zero"))
		}
	case resourcev1.DeviceAllocationModeAll:
		if count != 0 {
			errs = append(errs, field.Invalid(p.Child("count"), count, fmt.Sprintf("must not be specified when allocationMode is '%s'", mode)))
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("allocationMode"), mode,
			[]resourcev1.DeviceAllocationMode{resourcev1.DeviceAllocationModeAll, resourcev1.DeviceAllocationModeExactCount}))
	}
	return errs
}

// validateClass bounds the selectors and config.
func validateClass(obj, _ runtime.Object) field.ErrorList {
	c := obj.(*resourcev1.DeviceClass)
	var errs field.ErrorList
	if n := len(c.Spec.Selectors); n > resourcev1.DeviceSelectorsMaxSize {
		errs = append(errs, field.TooMany(field.NewPath("spec", "selectors"), n, resourcev1.DeviceSelectorsMaxSize))
	}
	for i, s := range c.Spec.Selectors {
		if s.CEL == nil || s.CEL.Expression == "" {
			errs = append(errs, field.Required(field.NewPath("spec", "selectors").Index(i).Child("cel", "expression"), ""))
		}
	}
	if n := len(c.Spec.Config); n > resourcev1.DeviceConfigMaxSize {
		errs = append(errs, field.TooMany(field.NewPath("spec", "config"), n, resourcev1.DeviceConfigMaxSize))
	}
	return errs
}

// applyDefaults sets what the API server defaults: a request's
// allocation mode (ExactCount) and count (1), in a claim and a claim
// template; a Pod's fields (defaultPod); a Namespace's finalizer.
func applyDefaults(obj runtime.Object) {
	switch o := obj.(type) {
	case *resourcev1.ResourceClaim:
		defaultClaimSpec(&o.Spec)
	case *resourcev1.ResourceClaimTemplate:
		defaultClaimSpec(&o.Spec.Spec)
	case *corev1.Pod:
		defaultPod(o)
	case *corev1.Namespace:
		if len(o.Spec.Finalizers) == 0 {
			o.Spec.Finalizers = []corev1.FinalizerName{corev1.FinalizerKubernetes}
		}
	}
}

func defaultClaimSpec(spec *resourcev1.ResourceClaimSpec) {
	def := func(mode *resourcev1.DeviceAllocationMode, count *int64) {
		if *mode == "" {
			*mode = resourcev1.DeviceAllocationModeExactCount
		}
		if *mode == resourcev1.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
	}
	for i := range spec.Devices.Requests {
		r := &spec.Devices.Requests[i]
		if r.Exactly != nil {
			def(&r.Exactly.AllocationMode, &r.Exactly.Count)
		}
		for j := range r.FirstAvailable {
			def(&r.FirstAvailable[j].AllocationMode, &r.FirstAvailable[j].Count)
		}
	}
}
