package podworker

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

// Claims made from ResourceClaimTemplates, as the resourceclaim
// controller makes them.

// podClaims resolves the pod's resourceClaims to ResourceClaims: a named
// one as it is, a template's made for the pod when it has none yet (as
// the resourceclaim controller makes it), and records the template
// claims' names in the pod's status.resourceClaimStatuses.
func (w *Worker) podClaims(ctx context.Context, pod *corev1.Pod) ([]claims.PodClaim, error) {
	var out []claims.PodClaim
	statuses := map[string]string{}
	for _, s := range pod.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			statuses[s.Name] = *s.ResourceClaimName
		}
	}
	var made []corev1.PodResourceClaimStatus
	for _, pc := range pod.Spec.ResourceClaims {
		switch {
		case pc.ResourceClaimName != nil:
			out = append(out, claims.PodClaim{Name: pc.Name, ResourceClaimName: *pc.ResourceClaimName})
			continue
		case pc.ResourceClaimTemplateName == nil:
			continue
		}
		name := statuses[pc.Name]
		if name == "" {
			var err error
			if name, err = w.claimFromTemplate(ctx, pod, pc); err != nil {
				w.recorder.Event(pod, corev1.EventTypeWarning, ReasonFailedClaimCreation, message(err.Error()))
				return nil, err
			}
		}
		made = append(made, corev1.PodResourceClaimStatus{Name: pc.Name, ResourceClaimName: &name})
		out = append(out, claims.PodClaim{Name: pc.Name, ResourceClaimName: name})
	}
	if len(made) > 0 {
		if err := w.updateStatus(ctx, pod, func(st *corev1.PodStatus) { st.ResourceClaimStatuses = made }); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// claimFromTemplate returns the claim made for pod claim pc: the one
// already made (found by owner and annotation: a crash may have come
// between its creation and the pod's status) or a new one.
func (w *Worker) claimFromTemplate(ctx context.Context, pod *corev1.Pod, pc corev1.PodResourceClaim) (string, error) {
	api := w.cfg.Client.ResourceV1().ResourceClaims(pod.Namespace)
	list, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("listing the claims of namespace %s: %w", pod.Namespace, err)
	}
	for _, c := range list.Items {
		if c.Annotations[PodClaimNameAnnotation] == pc.Name && ownedBy(&c, pod.UID) {
			return c.Name, nil
		}
	}
	tpl, err := w.cfg.Client.ResourceV1().ResourceClaimTemplates(pod.Namespace).Get(ctx, *pc.ResourceClaimTemplateName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("pod claim %s: ResourceClaimTemplate %s/%s: %w", pc.Name, pod.Namespace, *pc.ResourceClaimTemplateName, err)
	}
	annotations := map[string]string{PodClaimNameAnnotation: pc.Name}
	for k, v := range tpl.Spec.Annotations {
		annotations[k] = v
	}
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: generateName(pod.Name, pc.Name),
			Namespace:    pod.Namespace,
			Labels:       tpl.Spec.Labels,
			Annotations:  annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: tpl.Spec.Spec,
	}
	made, err := api.Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("pod claim %s: creating its claim from ResourceClaimTemplate %s: %w", pc.Name, tpl.Name, err)
	}
	w.log.Info("claim made from a template", "pod", pod.Namespace+"/"+pod.Name, "pod_claim", pc.Name, "claim", made.Name, "template", tpl.Name)
	return made.Name, nil
}

// generateName is the resourceclaim controller's: <pod>-<pod claim>-,
// each half cut so that the name with its random suffix stays short.
func generateName(pod, claim string) string {
	const maxBaseLen = 57
	if len(pod)+len(claim) > maxBaseLen {
		if len(pod) > maxBaseLen/2 {
			pod = pod[:maxBaseLen/2]
		}
		if len(claim) > maxBaseLen/2 {
			claim = claim[:maxBaseLen/2]
		}
	}
	return pod + "-" + claim + "-"
}

func ownedBy(c *resourcev1.ResourceClaim, uid types.UID) bool {
	for _, o := range c.OwnerReferences {
		if o.UID == uid && o.Controller != nil && *o.Controller {
			return true
		}
	}
	return false
}
