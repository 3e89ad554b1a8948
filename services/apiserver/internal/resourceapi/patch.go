package resourceapi

import (
	"fmt"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// patch applies a JSON merge patch (RFC 7386) or a strategic merge patch
// to the stored object, then writes it as an update would (so a
// resourceVersion in the patch is a precondition). JSON patches and
// server-side apply are 415.
func (s *Server) patch(w http.ResponseWriter, r *http.Request, req request) error {
	mt, _, _ := strings.Cut(r.Header.Get("Content-Type"), ";")
	pt := types.PatchType(strings.TrimSpace(mt))
	if pt != types.MergePatchType && pt != types.StrategicMergePatchType {
		return unsupportedMediaType(string(pt))
	}
	data, err := readBody(r)
	if err != nil {
		return err
	}
	var p map[string]any
	if err := utiljson.Unmarshal(data, &p); err != nil || p == nil {
		return apierrors.NewBadRequest(fmt.Sprintf("the patch is not a JSON object: %v", err))
	}
	return s.replace(w, req, func(old runtime.Object) (runtime.Object, error) {
		return applyPatch(req.kind, pt, old, p)
	})
}

// applyPatch works on the object's unstructured form, converted with
// apimachinery's converter both ways.
func applyPatch(k *kind, pt types.PatchType, old runtime.Object, p map[string]any) (runtime.Object, error) {
	orig, err := runtime.DefaultUnstructuredConverter.ToUnstructured(old)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	var merged map[string]any
	if pt == types.MergePatchType {
		merged = mergePatch(orig, p)
	} else if merged, err = strategicpatch.StrategicMergeMapPatch(orig, p, k.newObj()); err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the strategic merge patch cannot be applied: %v", err))
	}
	out := k.newObj()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(merged, out, false); err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("the patched object is not a valid %s: %v", k.gvk.Kind, err))
	}
	return out, nil
}

// mergePatch is RFC 7386: objects merge key by key, null removes a key,
// anything else replaces.
func mergePatch(target map[string]any, patch map[string]any) map[string]any {
	if target == nil {
		target = map[string]any{}
	}
	for k, v := range patch {
		if v == nil {
			delete(target, k)
			continue
		}
		if pv, ok := v.(map[string]any); ok {
			tv, _ := target[k].(map[string]any)
			target[k] = mergePatch(tv, pv)
			continue
		}
		target[k] = v
	}
	return target
}
