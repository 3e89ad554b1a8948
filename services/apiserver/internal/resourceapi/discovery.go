package resourceapi

import (
	"net/http"
	"runtime"
	"strings"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/version"

	npversion "github.com/nodeplug/nodeplug/pkg/version"
)

// ServedVersion is the Kubernetes version /version reports: the API
// types this server is built with.
const ServedVersion = "v1.37.2"

// serveDiscovery answers /version, /api, /api/v1, /apis, the group and
// its v1 resource list, and the health paths.
func (s *Server) serveDiscovery(w http.ResponseWriter, r *http.Request) {
	var obj kruntime.Object
	switch strings.Trim(r.URL.Path, "/") {
	case "healthz", "livez", "readyz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
		return
	case "version":
		s.writeVersion(w)
		return
	case "api":
		obj = &metav1.APIVersions{
			TypeMeta: metav1.TypeMeta{Kind: "APIVersions"}, Versions: []string{"v1"},
			ServerAddressByClientCIDRs: []metav1.ServerAddressByClientCIDR{{ClientCIDR: "0.0.0.0/0", ServerAddress: r.Host}},
		}
	case "api/v1":
		obj = resourceList("v1", coreKinds...)
	case "apis":
		obj = &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{resourceGroup()}}
	case "apis/resource.k8s.io":
		g := resourceGroup()
		g.TypeMeta = metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}
		obj = &g
	case "apis/resource.k8s.io/v1":
		obj = resourceList(kindSlice.gvk.GroupVersion().String(), resourceKinds...)
	}
	s.writeObject(w, http.StatusOK, obj)
}

func resourceGroup() metav1.APIGroup {
	v := metav1.GroupVersionForDiscovery{GroupVersion: kindSlice.gvk.GroupVersion().String(), Version: "v1"}
	return metav1.APIGroup{Name: kindSlice.gvk.Group, Versions: []metav1.GroupVersionForDiscovery{v}, PreferredVersion: v}
}

func resourceList(gv string, kinds ...*kind) *metav1.APIResourceList {
	l := &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"}, GroupVersion: gv}
	for _, k := range kinds {
		l.APIResources = append(l.APIResources, metav1.APIResource{
			Name: k.resource, SingularName: k.singular, Namespaced: k.namespaced, Kind: k.gvk.Kind,
			Verbs: k.verbs, ShortNames: k.shortNames,
		})
		if k.hasStatus {
			l.APIResources = append(l.APIResources, metav1.APIResource{
				Name: k.resource + "/status", Namespaced: k.namespaced, Kind: k.gvk.Kind,
				Verbs: []string{"get", "patch", "update"},
			})
		}
	}
	return l
}

// writeVersion answers /version (version.Info is no API object; the API
// server writes it as plain JSON too).
func (s *Server) writeVersion(w http.ResponseWriter) {
	info := version.Info{
		Major: "1", Minor: "37", GitVersion: ServedVersion + "+nodeplug-" + npversion.Version,
		Platform: runtime.GOOS + "/" + runtime.GOARCH, GoVersion: runtime.Version(), Compiler: runtime.Compiler,
	}
	data, err := utiljson.Marshal(info)
	if err != nil {
		s.writeError(w, &http.Request{}, apierrors.NewInternalError(err))
		return
	}
	w.Header().Set("Content-Type", kruntime.ContentTypeJSON)
	_, _ = w.Write(data)
}

// ensureNode makes the one Node, with a new UID, when the store has none
// of that name; a Node of another name (an earlier --node-name) goes.
func (s *Server) ensureNode() error {
	objs, _ := s.store.list(kindNode, func(kruntime.Object) bool { return true })
	for _, o := range objs {
		if n := o.(*corev1.Node); n.Name != s.node {
			if _, err := s.store.mutate(kindNode, n.Name, func(kruntime.Object) (kruntime.Object, error) { return nil, nil }); err != nil {
				return err
			}
		}
	}
	_, err := s.store.mutate(kindNode, s.node, func(old kruntime.Object) (kruntime.Object, error) {
		if old != nil {
			return nil, errNoChange
		}
		return &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{
				Name: s.node, UID: types.UID(uuid.NewString()), CreationTimestamp: metav1.Now(),
				Labels: map[string]string{
					corev1.LabelHostname: s.node, corev1.LabelOSStable: runtime.GOOS, corev1.LabelArchStable: runtime.GOARCH,
				},
			},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{
				Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "NodeplugServing",
				Message: "the node-local resource API of nodeplug", LastTransitionTime: metav1.Now(),
			}}},
		}, nil
	})
	return err
}

// unsupportedMediaType is 415 with the Status a client expects.
func unsupportedMediaType(mt string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusUnsupportedMediaType, Reason: metav1.StatusReasonUnsupportedMediaType,
		Message: "the body of the request was in an unknown format or not supported here: " + mt,
	}}
}
