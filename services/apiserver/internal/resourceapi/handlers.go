package resourceapi

import (
	"crypto/rand"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
)

func (s *Server) get(w http.ResponseWriter, _ *http.Request, req request) error {
	obj := s.store.get(req.kind, key(req.namespace, req.name))
	if obj == nil {
		return apierrors.NewNotFound(req.kind.groupResource(), req.name)
	}
	s.writeObject(w, http.StatusOK, obj)
	return nil
}

// parameterCodec decodes query parameters into options with the
// scheme's conversions.
var parameterCodec = runtime.NewParameterCodec(scheme)

// listOptions decodes the query as the API server does.
func listOptions(r *http.Request) (metav1.ListOptions, error) {
	var opts metav1.ListOptions
	if err := parameterCodec.DecodeParameters(r.URL.Query(), kindNode.gvk.GroupVersion(), &opts); err != nil {
		return opts, apierrors.NewBadRequest(fmt.Sprintf("invalid list options: %v", err))
	}
	return opts, nil
}

// matcher is the request's namespace, label and field selectors as one
// predicate on what selectors see of an object (attrs); an unknown field
// or a malformed selector is 400.
func matcher(k *kind, namespace string, opts metav1.ListOptions) (func(*attrs) bool, fields.Selector, error) {
	fsel, err := k.fieldSelector(opts.FieldSelector)
	if err != nil {
		return nil, nil, err
	}
	lsel, err := labels.Parse(opts.LabelSelector)
	if err != nil {
		return nil, nil, apierrors.NewBadRequest(fmt.Sprintf("invalid label selector %q: %v", opts.LabelSelector, err))
	}
	return func(a *attrs) bool {
		if a == nil || (namespace != "" && a.namespace != namespace) {
			return false
		}
		return lsel.Matches(a.labels) && fsel.Matches(a.fields)
	}, fsel, nil
}

// selection is what list and watch read of the query: the options, and
// their selectors as one predicate.
func selection(r *http.Request, req request) (metav1.ListOptions, func(*attrs) bool, error) {
	opts, err := listOptions(r)
	if err != nil {
		return opts, nil, err
	}
	match, _, err := matcher(req.kind, req.namespace, opts)
	return opts, match, err
}

// objectMatcher is match applied to objects of k.
func objectMatcher(k *kind, match func(*attrs) bool) func(runtime.Object) bool {
	return func(obj runtime.Object) bool { return match(k.attrsOf(obj)) }
}

// parseRV parses a resourceVersion given by a client ("" and "0": none).
func parseRV(rv string) (uint64, error) {
	if rv == "" || rv == "0" {
		return 0, nil
	}
	n, err := strconv.ParseUint(rv, 10, 64)
	if err != nil {
		return 0, apierrors.NewBadRequest(fmt.Sprintf("invalid resource version %q: %v", rv, err))
	}
	return n, nil
}

// list serves the current state, which satisfies every resourceVersion
// a client may ask for except an older Exact one (410) or one not reached
// yet. limit is not applied: the whole list comes in one page, without a
// continue token.
func (s *Server) list(w http.ResponseWriter, r *http.Request, req request) error {
	opts, match, err := selection(r, req)
	if err != nil {
		return err
	}
	want, err := parseRV(opts.ResourceVersion)
	if err != nil {
		return err
	}
	if opts.ResourceVersionMatch != "" && opts.ResourceVersion == "" {
		return apierrors.NewBadRequest("resourceVersionMatch is forbidden unless resourceVersion is provided")
	}
	objs, cur := s.store.list(req.kind, objectMatcher(req.kind, match))
	switch {
	case want > cur:
		return tooLargeRV(want, cur)
	case opts.ResourceVersionMatch == metav1.ResourceVersionMatchExact && want != cur:
		return apierrors.NewResourceExpired(fmt.Sprintf("too old resource version: %d (%d)", want, cur))
	}
	list := req.kind.newList()
	if err := meta.SetList(list, objs); err != nil {
		return apierrors.NewInternalError(err)
	}
	lm, err := meta.ListAccessor(list)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	lm.SetResourceVersion(strconv.FormatUint(cur, 10))
	list.GetObjectKind().SetGroupVersionKind(req.kind.listGVK())
	s.writeObject(w, http.StatusOK, list)
	return nil
}

// create stores a new object: server fields set, defaults applied, the
// name generated from generateName when asked, validated (422), and, for
// a driver, a slice of this node only (403).
func (s *Server) create(w http.ResponseWriter, r *http.Request, req request) error {
	if _, ok := r.URL.Query()["dryRun"]; ok {
		return apierrors.NewBadRequest("dryRun is not supported by the node-local resource API")
	}
	obj, m, err := readObject(r, req)
	if err != nil {
		return err
	}
	if m.GetResourceVersion() != "" {
		return apierrors.NewBadRequest("resourceVersion should not be set on objects to be created")
	}
	prepareCreate(obj)
	generate := m.GetName() == "" && m.GetGenerateName() != ""
	for attempt := 0; ; attempt++ {
		if generate {
			m.SetName(m.GetGenerateName() + randomSuffix())
		}
		if errs := append(validateMeta(req.kind, obj), req.kind.validate(obj, nil)...); len(errs) > 0 {
			return apierrors.NewInvalid(req.kind.gvk.GroupKind(), m.GetName(), errs)
		}
		if err := authorizeSlice(req.user, "create", s.node, obj); err != nil {
			return err
		}
		out, err := s.store.mutate(req.kind, key(m.GetNamespace(), m.GetName()), func(old runtime.Object) (runtime.Object, error) {
			if err := s.store.namespaceAdmitsLocked(req.kind, m.GetNamespace()); err != nil {
				return nil, err
			}
			if err := s.store.adminAccessAdmitsLocked(req.kind, obj); err != nil {
				return nil, err
			}
			if old != nil {
				return nil, apierrors.NewAlreadyExists(req.kind.groupResource(), m.GetName())
			}
			return obj, nil
		})
		if apierrors.IsAlreadyExists(err) && generate && attempt < 8 {
			continue
		}
		if err != nil {
			return err
		}
		if req.kind == kindEvent && s.store.count(kindEvent) > s.store.Limits().MaxEvents {
			s.expireEvents(time.Now())
		}
		s.writeObject(w, http.StatusCreated, out)
		return nil
	}
}

// readObject reads and decodes the body of a create or an update, in the
// URL's namespace (see checkNamespace).
func readObject(r *http.Request, req request) (runtime.Object, metav1.Object, error) {
	data, err := readBody(r)
	if err != nil {
		return nil, nil, err
	}
	obj, err := decodeBody(r, req.kind, data)
	if err != nil {
		return nil, nil, err
	}
	m, _ := meta.Accessor(obj)
	if err := checkNamespace(req, m); err != nil {
		return nil, nil, err
	}
	return obj, m, nil
}

// checkNamespace: a namespaced object takes the URL's namespace; another
// one in the body is 400.
func checkNamespace(req request, m metav1.Object) error {
	if !req.kind.namespaced {
		m.SetNamespace("")
		return nil
	}
	if ns := m.GetNamespace(); ns != "" && ns != req.namespace {
		return apierrors.NewBadRequest(fmt.Sprintf("the namespace of the provided object (%s) does not match the namespace sent on the request (%s)", ns, req.namespace))
	}
	m.SetNamespace(req.namespace)
	return nil
}

// prepareCreate sets what the server owns on a new object.
func prepareCreate(obj runtime.Object) {
	m, _ := meta.Accessor(obj)
	m.SetUID(types.UID(uuid.NewString()))
	m.SetCreationTimestamp(metav1.Now())
	m.SetGeneration(1)
	m.SetDeletionTimestamp(nil)
	m.SetDeletionGracePeriodSeconds(nil)
	m.SetManagedFields(nil)
	switch o := obj.(type) {
	case *resourcev1.ResourceClaim:
		o.Status = resourcev1.ResourceClaimStatus{}
	case *resourcev1.DeviceTaintRule:
		o.Status = resourcev1.DeviceTaintRuleStatus{}
	case *corev1.Pod:
		o.Status = corev1.PodStatus{Phase: corev1.PodPending}
	case *corev1.Namespace:
		o.Status = corev1.NamespaceStatus{Phase: corev1.NamespaceActive}
	}
	applyDefaults(obj)
}

// randomSuffix is five characters as the API server's name generator
// uses (no vowels, no confusable digits).
func randomSuffix() string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	var b [5]byte
	_, _ = rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b[:])
}

// update replaces an object (PUT) or its status.
func (s *Server) update(w http.ResponseWriter, r *http.Request, req request) error {
	obj, m, err := readObject(r, req)
	if err != nil {
		return err
	}
	if m.GetName() != req.name {
		return apierrors.NewBadRequest(fmt.Sprintf("the name of the object (%s) does not match the name on the URL (%s)", m.GetName(), req.name))
	}
	return s.replace(w, req, func(runtime.Object) (runtime.Object, error) { return obj, nil })
}

// replace is update and patch: next computes the new object from the
// stored one; a resourceVersion or UID in it that is not the stored one is
// 409; the server's fields are kept; a main-resource write keeps the
// status, a status write only changes the status; nothing changed means no
// write.
func (s *Server) replace(w http.ResponseWriter, req request, next func(old runtime.Object) (runtime.Object, error)) error {
	k := req.kind
	out, err := s.store.mutate(k, key(req.namespace, req.name), func(old runtime.Object) (runtime.Object, error) {
		if old == nil {
			return nil, apierrors.NewNotFound(k.groupResource(), req.name)
		}
		obj, err := next(old.DeepCopyObject())
		if err != nil {
			return nil, err
		}
		om, _ := meta.Accessor(old)
		nm, err := meta.Accessor(obj)
		if err != nil {
			return nil, apierrors.NewInternalError(err)
		}
		if rv := nm.GetResourceVersion(); rv != "" && rv != om.GetResourceVersion() {
			return nil, apierrors.NewConflict(k.groupResource(), req.name,
				fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
		}
		if uid := nm.GetUID(); uid != "" && uid != om.GetUID() {
			return nil, apierrors.NewConflict(k.groupResource(), req.name,
				fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", uid, om.GetUID()))
		}
		obj = prepareUpdate(req.subresource, obj, old)
		if errs := append(validateMeta(k, obj), k.validate(obj, old)...); len(errs) > 0 {
			return nil, apierrors.NewInvalid(k.gvk.GroupKind(), req.name, errs)
		}
		if err := authorizeSlice(req.user, "update", s.node, old, obj); err != nil {
			return nil, err
		}
		if unchanged(old, obj) {
			return nil, errNoChange
		}
		return obj, nil
	})
	if err != nil {
		return err
	}
	s.writeObject(w, http.StatusOK, out)
	return nil
}

// prepareUpdate keeps the fields the server owns and splits spec from
// status: a status write takes only the status, a main write keeps the
// stored status. The generation grows when the spec changes.
func prepareUpdate(subresource string, obj, old runtime.Object) runtime.Object {
	om, _ := meta.Accessor(old)
	nm, _ := meta.Accessor(obj)
	if subresource == "status" {
		out := old.DeepCopyObject()
		copyStatus(out, obj)
		m, _ := meta.Accessor(out)
		m.SetResourceVersion(nm.GetResourceVersion())
		return out
	}
	copyStatus(obj, old)
	nm.SetUID(om.GetUID())
	nm.SetCreationTimestamp(om.GetCreationTimestamp())
	nm.SetNamespace(om.GetNamespace())
	nm.SetName(om.GetName())
	nm.SetGenerateName(om.GetGenerateName())
	nm.SetManagedFields(nil)
	nm.SetDeletionTimestamp(om.GetDeletionTimestamp())
	applyDefaults(obj)
	nm.SetGeneration(om.GetGeneration())
	if !apiequality.Semantic.DeepEqual(specOf(old), specOf(obj)) {
		nm.SetGeneration(om.GetGeneration() + 1)
	}
	return obj
}

func specOf(obj runtime.Object) any {
	switch o := obj.(type) {
	case *resourcev1.ResourceSlice:
		return o.Spec
	case *resourcev1.ResourceClaim:
		return o.Spec
	case *resourcev1.DeviceClass:
		return o.Spec
	case *resourcev1.ResourceClaimTemplate:
		return o.Spec
	case *resourcev1.DeviceTaintRule:
		return o.Spec
	case *corev1.Pod:
		return o.Spec
	case *corev1.Namespace:
		return o.Spec
	}
	return nil
}

// copyStatus sets dst's status to src's, for the kinds with a status
// subresource (dst and src of the same kind): a status write changes only
// the status, a write of the object keeps the stored one.
func copyStatus(dst, src runtime.Object) {
	switch d := dst.(type) {
	case *resourcev1.ResourceClaim:
		d.Status = *src.(*resourcev1.ResourceClaim).Status.DeepCopy()
	case *resourcev1.DeviceTaintRule:
		d.Status = *src.(*resourcev1.DeviceTaintRule).Status.DeepCopy()
	case *corev1.Pod:
		d.Status = *src.(*corev1.Pod).Status.DeepCopy()
	case *corev1.Namespace:
		d.Status = *src.(*corev1.Namespace).Status.DeepCopy()
	}
}

// unchanged compares two versions of an object, ignoring the
// resourceVersion and the type meta.
func unchanged(old, obj runtime.Object) bool {
	a, b := old.DeepCopyObject(), obj.DeepCopyObject()
	for _, o := range []runtime.Object{a, b} {
		m, _ := meta.Accessor(o)
		m.SetResourceVersion("")
		o.GetObjectKind().SetGroupVersionKind(schemaEmpty)
	}
	return apiequality.Semantic.DeepEqual(a, b)
}
