package podworker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/nodeplug/nodeplug/services/dramanager/internal/claimalloc"
)

// Eviction by NoExecute device taints, as a cluster's device taint
// eviction controller does it: a pod that runs on this node with a claim
// allocated a device tainted NoExecute — in its slice, or by a
// DeviceTaintRule — is deleted, unless the allocation tolerates the taint
// (the tolerations recorded in the claim's allocation result). A
// toleration with tolerationSeconds delays the deletion by that long from
// the taint's timeAdded. Before the deletion the pod gets a
// DeviceTaintManagerEviction event and its DisruptionTarget condition
// (reason DeletionByDeviceTaintManager); the deletion then stops its
// containers and releases its claims as any deletion does.

// Taints are the NoExecute taints of the node's devices
// (claimalloc.Allocator).
type Taints interface {
	NoExecuteTaints(ctx context.Context) (map[claimalloc.DeviceKey][]resourcev1.DeviceTaint, error)
}

// Eviction event and condition, the device taint eviction controller's.
const (
	ReasonTaintEviction          = "DeviceTaintManagerEviction"
	ReasonDeletionByTaintManager = "DeletionByDeviceTaintManager"
	defaultEvictionInterval      = time.Second
)

// evictLoop looks at the running pods' devices' taints every interval
// until ctx ends.
func (w *Worker) evictLoop(ctx context.Context) {
	t := time.NewTicker(w.cfg.EvictionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := w.evictTainted(ctx); err != nil && ctx.Err() == nil {
			w.log.Warn("device taints not checked", "error", err)
		}
	}
}

// evictTainted deletes the pods whose devices carry a NoExecute taint
// their claims do not tolerate (any longer).
func (w *Worker) evictTainted(ctx context.Context) error {
	w.mu.Lock()
	running := len(w.prepared)
	w.mu.Unlock()
	if running == 0 {
		return nil
	}
	taints, err := w.cfg.Taints.NoExecuteTaints(ctx)
	if err != nil || len(taints) == 0 {
		return err
	}
	// All decisions first, then the evictions, by namespace and name.
	type eviction struct {
		pod *corev1.Pod
		why string
	}
	var due []eviction
	for _, obj := range w.pods.GetStore().List() {
		pod := obj.(*corev1.Pod)
		w.mu.Lock()
		prepared := w.prepared[pod.UID]
		w.mu.Unlock()
		if prepared == nil || pod.DeletionTimestamp != nil {
			continue
		}
		why, err := w.untolerated(ctx, pod, prepared, taints)
		if err != nil {
			return err
		}
		if why != "" {
			due = append(due, eviction{pod, why})
		}
	}
	slices.SortFunc(due, func(a, b eviction) int {
		return strings.Compare(a.pod.Namespace+"/"+a.pod.Name, b.pod.Namespace+"/"+b.pod.Name)
	})
	for _, ev := range due {
		if err := w.evict(ctx, ev.pod, ev.why); err != nil {
			return fmt.Errorf("evicting pod %s/%s: %w", ev.pod.Namespace, ev.pod.Name, err)
		}
	}
	return nil
}

// untolerated says which taints, due now, the pod's claims' devices carry
// untolerated; "" when none. Only the claims holding a tainted device
// are read, for the tolerations their allocation recorded.
func (w *Worker) untolerated(ctx context.Context, pod *corev1.Pod, prepared *preparedPod, taints map[claimalloc.DeviceKey][]resourcev1.DeviceTaint) (string, error) {
	var names []string
	for k, claimNames := range prepared.claims {
		if len(taints[k]) > 0 {
			names = append(names, claimNames...)
		}
	}
	slices.Sort(names)
	now := time.Now()
	var why []string
	for _, name := range slices.Compact(names) {
		c, err := w.cfg.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("reading claim %s/%s: %w", pod.Namespace, name, err)
		}
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			for _, t := range taints[claimalloc.DeviceKey{Driver: r.Driver, Pool: r.Pool, Device: r.Device}] {
				if due, ok := evictionTime(t, r.Tolerations); ok && !due.After(now) {
					why = append(why, fmt.Sprintf("taint %s on device %s/%s/%s of claim %s", taintString(t), r.Driver, r.Pool, r.Device, name))
				}
			}
		}
	}
	return strings.Join(why, "; "), nil
}

// evictionTime is when taint evicts a device allocated with tolerations:
// its timeAdded, later by the shortest tolerationSeconds of the
// tolerations that tolerate it for a while; ok is false when one
// tolerates it for ever.
func evictionTime(taint resourcev1.DeviceTaint, tolerations []resourcev1.DeviceToleration) (time.Time, bool) {
	var added time.Time
	if taint.TimeAdded != nil {
		added = taint.TimeAdded.Time
	}
	delay := time.Duration(-1)
	for _, tol := range tolerations {
		if !resourceclaim.ToleratesTaint(tol, taint) {
			continue
		}
		if tol.TolerationSeconds == nil {
			return time.Time{}, false
		}
		if d := time.Duration(max(*tol.TolerationSeconds, 0)) * time.Second; delay < 0 || d < delay {
			delay = d
		}
	}
	return added.Add(max(delay, 0)), true
}

func taintString(t resourcev1.DeviceTaint) string {
	if t.Value == "" {
		return fmt.Sprintf("%s:%s", t.Key, t.Effect)
	}
	return fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect)
}

// evict records the eviction on the pod (event, DisruptionTarget) and
// deletes it, with its UID as precondition.
func (w *Worker) evict(ctx context.Context, pod *corev1.Pod, why string) error {
	w.log.Info("evicting pod: NoExecute device taint", "pod", pod.Namespace+"/"+pod.Name, "why", why)
	w.recorder.Event(pod, corev1.EventTypeNormal, ReasonTaintEviction, message("Marking for deletion: "+why))
	err := w.updateStatus(ctx, pod, func(st *corev1.PodStatus) {
		setCondition(st, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue,
			Reason: ReasonDeletionByTaintManager, Message: message("Device Taint manager: deleting due to NoExecute taint: " + why),
			LastTransitionTime: metav1.Now()})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	err = w.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}
