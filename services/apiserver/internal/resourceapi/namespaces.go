package resourceapi

import (
	"fmt"
	"net/http"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	"github.com/google/uuid"
)

// Namespaces behave as kube-apiserver's NamespaceLifecycle admission and
// its namespace controller make them behave: an object is created only in
// a namespace that exists and is not being deleted; deleting a namespace
// marks it Terminating, deletes everything in it, then the namespace
// itself. The node-local API keeps no finalizers (no controller here would
// act on them), so that is done at once, within the delete; a restart in
// the middle of it finishes it (ensureNamespaces).

// ensureNamespaces makes the namespaces a new cluster has, and finishes
// the deletion of any namespace a restart interrupted.
func (s *Server) ensureNamespaces() error {
	for _, name := range initialNamespaces {
		_, err := s.store.mutate(kindNamespace, name, func(old runtime.Object) (runtime.Object, error) {
			if old != nil {
				return nil, errNoChange
			}
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
				Name: name, UID: types.UID(uuid.NewString()), CreationTimestamp: metav1.Now(), Generation: 1,
				Labels: map[string]string{corev1.LabelMetadataName: name},
			}}
			ns.Status.Phase = corev1.NamespaceActive
			applyDefaults(ns)
			return ns, nil
		})
		if err != nil {
			return err
		}
	}
	objs, _ := s.store.list(kindNamespace, func(o runtime.Object) bool {
		return o.(*corev1.Namespace).DeletionTimestamp != nil
	})
	for _, o := range objs {
		if err := s.finishNamespace(o.(*corev1.Namespace).Name); err != nil {
			return err
		}
	}
	return nil
}

// namespaceAdmitsLocked is NamespaceLifecycle's check of a create in ns:
// 404 when ns does not exist, 403 while it is being deleted. The caller
// holds s.mu (it runs inside a mutate).
func (s *Store) namespaceAdmitsLocked(k *kind, ns string) error {
	if !k.namespaced {
		return nil
	}
	o, ok := s.objs[kindNamespace][ns]
	if !ok {
		return apierrors.NewNotFound(kindNamespace.groupResource(), ns)
	}
	if o.(*corev1.Namespace).Status.Phase == corev1.NamespaceTerminating {
		return apierrors.NewForbidden(k.groupResource(), "",
			fmt.Errorf("unable to create new content in namespace %s because it is being terminated", ns))
	}
	return nil
}

// deleteNamespace deletes a namespace and everything in it. default,
// kube-system and kube-public may not be deleted.
func (s *Server) deleteNamespace(w http.ResponseWriter, req request, opts metav1.DeleteOptions) error {
	if slices.Contains(undeletableNamespaces, req.name) {
		return apierrors.NewForbidden(kindNamespace.groupResource(), req.name, fmt.Errorf("this namespace may not be deleted"))
	}
	_, err := s.store.mutate(kindNamespace, req.name, func(old runtime.Object) (runtime.Object, error) {
		if old == nil {
			return nil, apierrors.NewNotFound(kindNamespace.groupResource(), req.name)
		}
		if err := checkPreconditions(kindNamespace, req.name, opts.Preconditions, old); err != nil {
			return nil, err
		}
		ns := old.(*corev1.Namespace)
		if ns.DeletionTimestamp != nil {
			return nil, errNoChange
		}
		now := metav1.Now()
		ns.DeletionTimestamp = &now
		ns.Status.Phase = corev1.NamespaceTerminating
		return ns, nil
	})
	if err != nil {
		return err
	}
	if err := s.finishNamespace(req.name); err != nil {
		return err
	}
	s.writeObject(w, http.StatusOK, deletedStatus(kindNamespace, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: req.name}}))
	return nil
}

// finishNamespace deletes every object in a Terminating namespace, then
// the namespace. Pods go first, then the objects they use.
func (s *Server) finishNamespace(name string) error {
	order := []*kind{kindPod, kindClaim, kindClaimTemplate, kindEvent}
	for _, k := range allKinds {
		if k.namespaced && !slices.Contains(order, k) {
			order = append(order, k)
		}
	}
	for _, k := range order {
		objs, _ := s.store.list(k, func(o runtime.Object) bool {
			m, err := meta.Accessor(o)
			return err == nil && m.GetNamespace() == name
		})
		for _, o := range objs {
			if _, err := s.store.mutate(k, objectKey(o), func(old runtime.Object) (runtime.Object, error) {
				if old == nil {
					return nil, errNoChange
				}
				return nil, nil
			}); err != nil {
				return err
			}
		}
	}
	_, err := s.store.mutate(kindNamespace, name, func(old runtime.Object) (runtime.Object, error) {
		if old == nil {
			return nil, errNoChange
		}
		return nil, nil
	})
	return err
}

// adminAccessAdmitsLocked is kube-apiserver's check of a claim or claim
// template asking for admin access to devices: its namespace must carry
// the label resource.kubernetes.io/admin-access=true (422 otherwise,
// naming each request). The caller holds s.mu.
func (s *Store) adminAccessAdmitsLocked(k *kind, obj runtime.Object) error {
	var spec *resourcev1.ResourceClaimSpec
	var at *field.Path
	switch o := obj.(type) {
	case *resourcev1.ResourceClaim:
		spec, at = &o.Spec, field.NewPath("spec")
	case *resourcev1.ResourceClaimTemplate:
		spec, at = &o.Spec.Spec, field.NewPath("spec", "spec")
	default:
		return nil
	}
	m, _ := meta.Accessor(obj)
	if o, ok := s.objs[kindNamespace][m.GetNamespace()]; ok && o.(*corev1.Namespace).Labels[resourcev1.DRAAdminNamespaceLabelKey] == "true" {
		return nil
	}
	const why = "admin access to devices requires the `" + resourcev1.DRAAdminNamespaceLabelKey + ": true` label on the containing namespace"
	var errs field.ErrorList
	for i, r := range spec.Devices.Requests {
		rp := at.Child("devices", "requests").Index(i)
		if r.Exactly != nil && ptr.Deref(r.Exactly.AdminAccess, false) {
			errs = append(errs, field.Forbidden(rp.Child("exactly", "adminAccess"), why))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return apierrors.NewInvalid(k.gvk.GroupKind(), m.GetName(), errs)
}
