package resourceapi

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// scheme holds the only types the API serves: core v1 (Node, Namespace,
// Pod, Event), resource.k8s.io v1 and the meta types (Status, WatchEvent, discovery lists). Objects are
// encoded and decoded by its codecs only.
var (
	scheme = runtime.NewScheme()
	codecs serializer.CodecFactory
	// jsonSerializer writes every response and watch event.
	jsonSerializer runtime.Serializer
	// storageCodec encodes and decodes objects as stored: JSON with
	// apiVersion and kind.
	storageCodec runtime.Codec
)

func init() {
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, resourcev1.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	codecs = serializer.NewCodecFactory(scheme)
	json, _ := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), runtime.ContentTypeJSON)
	jsonSerializer = json.Serializer
	storageCodec = codecs.LegacyCodec(kindSlice.gvk.GroupVersion(), kindNode.gvk.GroupVersion())
}

// kind describes one served resource: how to make its objects, which
// fields a field selector may name, and how to validate it.
type kind struct {
	gvk        schema.GroupVersionKind
	resource   string // plural, as in the URL
	singular   string
	namespaced bool
	hasStatus  bool
	shortNames []string
	// verbs are those listed in discovery.
	verbs    []string
	newObj   func() runtime.Object
	newList  func() runtime.Object
	fields   func(runtime.Object) fields.Set
	validate func(obj, old runtime.Object) field.ErrorList
	// writable is false for the Node, which only the API itself creates.
	writable bool
	// maxBytes bounds an object of this kind as stored, below
	// MaxObjectBytes (0: MaxObjectBytes).
	maxBytes int
}

// objectLimit is the most an object of k may weigh, encoded.
func (k *kind) objectLimit() int {
	if k.maxBytes > 0 {
		return k.maxBytes
	}
	return MaxObjectBytes
}

var (
	verbsRW   = []string{"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
	verbsRead = []string{"get", "list", "watch"}
)

// Kinds served, by resource name.
var (
	kindSlice = &kind{
		gvk: resourcev1.SchemeGroupVersion.WithKind("ResourceSlice"), resource: "resourceslices", singular: "resourceslice",
		verbs: verbsRW, writable: true,
		newObj:  func() runtime.Object { return &resourcev1.ResourceSlice{} },
		newList: func() runtime.Object { return &resourcev1.ResourceSliceList{} },
		fields: func(o runtime.Object) fields.Set {
			s := o.(*resourcev1.ResourceSlice)
			return fields.Set{
				"metadata.name":                          s.Name,
				resourcev1.ResourceSliceSelectorDriver:   s.Spec.Driver,
				resourcev1.ResourceSliceSelectorNodeName: nodeNameOf(s),
				resourcev1.ResourceSliceSelectorPoolName: s.Spec.Pool.Name,
			}
		},
		validate: validateSlice,
	}
	kindClaim = &kind{
		gvk: resourcev1.SchemeGroupVersion.WithKind("ResourceClaim"), resource: "resourceclaims", singular: "resourceclaim",
		namespaced: true, hasStatus: true, verbs: verbsRW, writable: true,
		newObj:  func() runtime.Object { return &resourcev1.ResourceClaim{} },
		newList: func() runtime.Object { return &resourcev1.ResourceClaimList{} },
		fields: func(o runtime.Object) fields.Set {
			c := o.(*resourcev1.ResourceClaim)
			return fields.Set{"metadata.name": c.Name, "metadata.namespace": c.Namespace}
		},
		validate: validateClaim,
	}
	kindClass = &kind{
		gvk: resourcev1.SchemeGroupVersion.WithKind("DeviceClass"), resource: "deviceclasses", singular: "deviceclass",
		verbs: verbsRW, writable: true,
		newObj:  func() runtime.Object { return &resourcev1.DeviceClass{} },
		newList: func() runtime.Object { return &resourcev1.DeviceClassList{} },
		fields: func(o runtime.Object) fields.Set {
			return fields.Set{"metadata.name": o.(*resourcev1.DeviceClass).Name}
		},
		validate: validateClass,
	}
	kindNode = &kind{
		gvk: corev1.SchemeGroupVersion.WithKind("Node"), resource: "nodes", singular: "node",
		shortNames: []string{"no"}, verbs: verbsRead,
		newObj:  func() runtime.Object { return &corev1.Node{} },
		newList: func() runtime.Object { return &corev1.NodeList{} },
		fields: func(o runtime.Object) fields.Set {
			return fields.Set{"metadata.name": o.(*corev1.Node).Name}
		},
	}
	kindClaimTemplate = &kind{
		gvk: resourcev1.SchemeGroupVersion.WithKind("ResourceClaimTemplate"), resource: "resourceclaimtemplates", singular: "resourceclaimtemplate",
		namespaced: true, verbs: verbsRW, writable: true,
		newObj:  func() runtime.Object { return &resourcev1.ResourceClaimTemplate{} },
		newList: func() runtime.Object { return &resourcev1.ResourceClaimTemplateList{} },
		fields: func(o runtime.Object) fields.Set {
			t := o.(*resourcev1.ResourceClaimTemplate)
			return fields.Set{"metadata.name": t.Name, "metadata.namespace": t.Namespace}
		},
		validate: validateClaimTemplate,
	}
	kindTaintRule = &kind{
		gvk: resourcev1.SchemeGroupVersion.WithKind("DeviceTaintRule"), resource: "devicetaintrules", singular: "devicetaintrule",
		hasStatus: true, verbs: verbsRW, writable: true,
		newObj:  func() runtime.Object { return &resourcev1.DeviceTaintRule{} },
		newList: func() runtime.Object { return &resourcev1.DeviceTaintRuleList{} },
		fields: func(o runtime.Object) fields.Set {
			return fields.Set{"metadata.name": o.(*resourcev1.DeviceTaintRule).Name}
		},
		validate: validateTaintRule,
	}
	kindNamespace = &kind{
		gvk: corev1.SchemeGroupVersion.WithKind("Namespace"), resource: "namespaces", singular: "namespace",
		shortNames: []string{"ns"}, hasStatus: true, writable: true,
		verbs:   []string{"create", "delete", "get", "list", "patch", "update", "watch"},
		newObj:  func() runtime.Object { return &corev1.Namespace{} },
		newList: func() runtime.Object { return &corev1.NamespaceList{} },
		fields: func(o runtime.Object) fields.Set {
			n := o.(*corev1.Namespace)
			return fields.Set{"metadata.name": n.Name, "status.phase": string(n.Status.Phase)}
		},
		validate: validateNamespace,
	}
	kindPod = &kind{
		gvk: corev1.SchemeGroupVersion.WithKind("Pod"), resource: "pods", singular: "pod",
		namespaced: true, hasStatus: true, shortNames: []string{"po"}, verbs: verbsRW, writable: true,
		newObj:   func() runtime.Object { return &corev1.Pod{} },
		newList:  func() runtime.Object { return &corev1.PodList{} },
		fields:   podFields,
		validate: validatePod,
	}
	kindEvent = &kind{
		gvk: corev1.SchemeGroupVersion.WithKind("Event"), resource: "events", singular: "event",
		namespaced: true, shortNames: []string{"ev"}, verbs: verbsRW, writable: true,
		newObj:   func() runtime.Object { return &corev1.Event{} },
		newList:  func() runtime.Object { return &corev1.EventList{} },
		fields:   eventFields,
		validate: validateEvent,
		maxBytes: MaxEventBytes,
	}
	allKinds = []*kind{kindSlice, kindClaim, kindClass, kindClaimTemplate, kindTaintRule, kindNode, kindNamespace, kindPod, kindEvent}
	// coreKinds and resourceKinds are the kinds of /api/v1 and of
	// /apis/resource.k8s.io/v1, in discovery's order.
	coreKinds     = []*kind{kindNamespace, kindNode, kindPod, kindEvent}
	resourceKinds = []*kind{kindSlice, kindClaim, kindClass, kindClaimTemplate, kindTaintRule}
)

func nodeNameOf(s *resourcev1.ResourceSlice) string {
	if s.Spec.NodeName == nil {
		return ""
	}
	return *s.Spec.NodeName
}

// fieldSelector parses a field selector and checks that it names only
// fields this kind supports, as a real server does (400 otherwise).
func (k *kind) fieldSelector(s string) (fields.Selector, error) {
	if s == "" {
		return fields.Everything(), nil
	}
	sel, err := fields.ParseSelector(s)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid field selector %q: %v", s, err))
	}
	known := k.fields(k.newObj())
	for _, r := range sel.Requirements() {
		if _, ok := known[r.Field]; !ok {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("field label not supported: %s", r.Field))
		}
	}
	return sel, nil
}

// key is where an object is kept: "namespace/name" or "name".
func key(namespace, name string) string {
	if namespace == "" {
		return name
	}
	return namespace + "/" + name
}

// objectKey is key for an object.
func objectKey(obj runtime.Object) string {
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	return key(m.GetNamespace(), m.GetName())
}

// groupResource is the kind's GroupResource, for error messages.
func (k *kind) groupResource() schema.GroupResource {
	return schema.GroupResource{Group: k.gvk.Group, Resource: k.resource}
}

// setTypeMeta sets the apiVersion and kind an encoded object carries.
func (k *kind) setTypeMeta(obj runtime.Object) {
	obj.GetObjectKind().SetGroupVersionKind(k.gvk)
}

// listGVK is the kind of the kind's list.
func (k *kind) listGVK() schema.GroupVersionKind {
	return k.gvk.GroupVersion().WithKind(k.gvk.Kind + "List")
}
