package podworker

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// The pod's binding and status, written as the scheduler and the kubelet
// write them.

// bind sets the pod's spec.nodeName to this node, as the scheduler's
// binding does.
func (w *Worker) bind(ctx context.Context, pod *corev1.Pod) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := w.cfg.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return fmt.Errorf("pod %s/%s was replaced: %w", pod.Namespace, pod.Name, errdefs.ErrFailedPrecondition)
		}
		if cur.Spec.NodeName != "" {
			return nil
		}
		cur.Spec.NodeName = w.cfg.Node
		_, err = w.cfg.Client.CoreV1().Pods(pod.Namespace).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
}

// setScheduled writes the pod's PodScheduled condition and, once it is
// scheduled and noRuntime, its containers' states: waiting, as no runtime
// runs them.
func (w *Worker) setScheduled(ctx context.Context, pod *corev1.Pod, status corev1.ConditionStatus, reason, message string, noRuntime bool) error {
	return w.updateStatus(ctx, pod, func(st *corev1.PodStatus) {
		now := metav1.Now()
		cond := corev1.PodCondition{Type: corev1.PodScheduled, Status: status, Reason: reason, Message: message, LastTransitionTime: now}
		setCondition(st, cond)
		if status != corev1.ConditionTrue || !noRuntime {
			return
		}
		st.ContainerStatuses = waiting(pod.Spec.Containers, st.ContainerStatuses)
		st.InitContainerStatuses = waiting(pod.Spec.InitContainers, st.InitContainerStatuses)
	})
}

func setCondition(st *corev1.PodStatus, cond corev1.PodCondition) {
	for i, c := range st.Conditions {
		if c.Type == cond.Type {
			if c.Status == cond.Status {
				cond.LastTransitionTime = c.LastTransitionTime
			}
			st.Conditions[i] = cond
			return
		}
	}
	st.Conditions = append(st.Conditions, cond)
}

// waiting is the status of containers no runtime runs: waiting, with the
// reason; a container with a status of its own keeps it.
func waiting(cs []corev1.Container, have []corev1.ContainerStatus) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, 0, len(cs))
	for _, c := range cs {
		st := corev1.ContainerStatus{Name: c.Name, Image: c.Image,
			State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: ReasonNoContainerRuntime, Message: noRuntimeMessage}}}
		for _, h := range have {
			if h.Name == c.Name && h.State.Waiting == nil {
				st = h
			}
		}
		out = append(out, st)
	}
	return out
}

// updateStatus applies change to the pod's stored status and writes it
// when it changed. Most looks at a pod whose containers run change
// nothing: those are told by the informer's copy (pod), without a read of
// the API; a copy behind the API is followed by an update that looks
// again.
func (w *Worker) updateStatus(ctx context.Context, pod *corev1.Pod, change func(*corev1.PodStatus)) error {
	cached := pod.Status.DeepCopy()
	change(cached)
	if statusEqual(pod.Status, *cached) {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := w.cfg.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cur.UID != pod.UID {
			return fmt.Errorf("pod %s/%s was replaced: %w", pod.Namespace, pod.Name, errdefs.ErrFailedPrecondition)
		}
		next := cur.DeepCopy()
		change(&next.Status)
		if statusEqual(cur.Status, next.Status) {
			return nil
		}
		_, err = w.cfg.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, next, metav1.UpdateOptions{})
		return err
	})
}

// statusEqual compares two statuses ignoring the conditions' times.
func statusEqual(a, b corev1.PodStatus) bool {
	strip := func(s corev1.PodStatus) corev1.PodStatus {
		s = *s.DeepCopy()
		for i := range s.Conditions {
			s.Conditions[i].LastTransitionTime = metav1.Time{}
		}
		return s
	}
	return apiequality.Semantic.DeepEqual(strip(a), strip(b))
}
