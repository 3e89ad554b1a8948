package resourceapi

import (
	"fmt"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var schemaEmpty = schema.GroupVersionKind{}

// deleteOptions decodes the DeleteOptions a client sends as the body.
func deleteOptions(r *http.Request) (metav1.DeleteOptions, error) {
	var opts metav1.DeleteOptions
	data, err := readBody(r)
	if err != nil || len(data) == 0 {
		return opts, err
	}
	info, err := serializerFor(r.Header.Get("Content-Type"))
	if err != nil {
		return opts, err
	}
	def := metav1.SchemeGroupVersion.WithKind("DeleteOptions")
	if _, _, err := info.Serializer.Decode(data, &def, &opts); err != nil {
		return opts, apierrors.NewBadRequest(fmt.Sprintf("the body of the request could not be decoded as DeleteOptions: %v", err))
	}
	if len(opts.DryRun) > 0 {
		return opts, apierrors.NewBadRequest("dryRun is not supported by the node-local resource API")
	}
	return opts, nil
}

// checkPreconditions is 409 when the stored object is not the one the
// client named.
func checkPreconditions(k *kind, name string, p *metav1.Preconditions, obj runtime.Object) error {
	if p == nil {
		return nil
	}
	m, _ := meta.Accessor(obj)
	if p.UID != nil && *p.UID != m.GetUID() {
		return apierrors.NewConflict(k.groupResource(), name,
			fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", *p.UID, m.GetUID()))
	}
	if p.ResourceVersion != nil && *p.ResourceVersion != m.GetResourceVersion() {
		return apierrors.NewConflict(k.groupResource(), name,
			fmt.Errorf("precondition failed: ResourceVersion in precondition: %v, ResourceVersion in object meta: %v",
				*p.ResourceVersion, m.GetResourceVersion()))
	}
	return nil
}

// delete removes an object at once (finalizers and grace periods are not
// kept: no controller here would act on them).
func (s *Server) delete(w http.ResponseWriter, r *http.Request, req request) error {
	opts, err := deleteOptions(r)
	if err != nil {
		return err
	}
	k := req.kind
	if k == kindNamespace {
		return s.deleteNamespace(w, req, opts)
	}
	out, err := s.store.mutate(k, key(req.namespace, req.name), func(old runtime.Object) (runtime.Object, error) {
		if old == nil {
			return nil, apierrors.NewNotFound(k.groupResource(), req.name)
		}
		if err := checkPreconditions(k, req.name, opts.Preconditions, old); err != nil {
			return nil, err
		}
		if k == kindSlice {
			if err := authorizeSlice(req.user, "delete", s.node, old); err != nil {
				return nil, err
			}
		}
		return nil, nil
	})
	if err != nil {
		return err
	}
	s.writeObject(w, http.StatusOK, deletedStatus(k, out))
	return nil
}

// deletedStatus is the success Status of a delete.
func deletedStatus(k *kind, obj runtime.Object) *metav1.Status {
	st := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusSuccess}
	if m, err := meta.Accessor(obj); err == nil && obj != nil {
		st.Details = &metav1.StatusDetails{Name: m.GetName(), Group: k.gvk.Group, Kind: k.resource, UID: m.GetUID()}
	}
	return st
}

// deleteCollection deletes every object the selectors match, each as its
// own write; a driver must limit it to this node's slices.
func (s *Server) deleteCollection(w http.ResponseWriter, r *http.Request, req request) error {
	opts, err := listOptions(r)
	if err != nil {
		return err
	}
	dopts, err := deleteOptions(r)
	if err != nil {
		return err
	}
	k := req.kind
	amatch, fsel, err := matcher(k, req.namespace, opts)
	if err != nil {
		return err
	}
	if k == kindSlice {
		if err := authorizeSliceCollection(req.user, s.node, fsel); err != nil {
			return err
		}
	}
	match := objectMatcher(k, amatch)
	objs, _ := s.store.list(k, match)
	list := k.newList()
	var deleted []runtime.Object
	for _, obj := range objs {
		did := false
		out, err := s.store.mutate(k, objectKey(obj), func(old runtime.Object) (runtime.Object, error) {
			if old == nil || !match(old) {
				return nil, errNoChange
			}
			if err := checkPreconditions(k, objectKey(old), dopts.Preconditions, old); err != nil {
				return nil, err
			}
			if err := authorizeSlice(req.user, "deletecollection", s.node, old); err != nil {
				return nil, err
			}
			did = true
			return nil, nil
		})
		if err != nil {
			return err
		}
		if did {
			deleted = append(deleted, out)
		}
	}
	if err := meta.SetList(list, deleted); err != nil {
		return apierrors.NewInternalError(err)
	}
	list.GetObjectKind().SetGroupVersionKind(k.listGVK())
	s.writeObject(w, http.StatusOK, list)
	return nil
}
