package podworker

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/services/internal/containers"
)

// The pod's status from its containers' states, as the kubelet writes it.

// ContainerIDPrefix names podman in a container status's containerID, as
// the kubelet's "containerd://…" names containerd. Each runtime's prefix
// is the first word of its name: "docker://" for docker (as with the
// kubelet's dockershim).
const ContainerIDPrefix = "podman://"

// containerIDPrefix is the prefix of the containerIDs of the runtime
// named name (containers.Runtime's Name: the runtime, a space and its
// version).
func containerIDPrefix(name string) string {
	runtime, _, _ := strings.Cut(name, " ")
	return runtime + "://"
}

// status writes the containers' states, the pod's phase and its
// conditions into st.
func (r *podRun) status(st *corev1.PodStatus, initDone bool) {
	now := metav1.Now()
	if st.StartTime == nil {
		st.StartTime = &now
	}
	st.InitContainerStatuses = r.containerStatuses(r.pod.Spec.InitContainers, reasonPodInitializing)
	appWaiting := reasonPodInitializing
	if initDone {
		appWaiting = reasonContainerCreate
	}
	st.ContainerStatuses = r.containerStatuses(r.pod.Spec.Containers, appWaiting)
	st.Phase = r.phase(initDone)
	cond := func(t corev1.PodConditionType, ok bool, reason string) {
		c := corev1.PodCondition{Type: t, Status: corev1.ConditionFalse, LastTransitionTime: now}
		if ok {
			c.Status = corev1.ConditionTrue
		} else {
			c.Reason = reason
		}
		setCondition(st, c)
	}
	ready := initDone && allRunning(st.ContainerStatuses)
	notReady := "ContainersNotReady"
	if st.Phase == corev1.PodSucceeded || st.Phase == corev1.PodFailed {
		notReady = "PodCompleted"
	}
	cond(corev1.PodReadyToStartContainers, true, "")
	cond(corev1.PodInitialized, initDone, "ContainersNotInitialized")
	cond(corev1.ContainersReady, ready, notReady)
	cond(corev1.PodReady, ready, notReady)
}

func allRunning(sts []corev1.ContainerStatus) bool {
	for _, s := range sts {
		if s.State.Running == nil {
			return false
		}
	}
	return len(sts) > 0
}

// containerStatuses are the states of cs; a container with no start yet
// waits with reason notStarted.
func (r *podRun) containerStatuses(cs []corev1.Container, notStarted string) []corev1.ContainerStatus {
	out := make([]corev1.ContainerStatus, 0, len(cs))
	for _, c := range cs {
		st := corev1.ContainerStatus{Name: c.Name, Image: c.Image, Started: new(false)}
		s, ok := r.have[c.Name]
		if ok {
			st.ContainerID = r.idPrefix + s.ID
			st.RestartCount = int32(restartCount(s))
			switch s.Status {
			case containers.StatusRunning:
				st.State.Running = &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(s.StartedAt)}
				st.Ready, st.Started = true, new(true)
			case containers.StatusExited:
				st.State.Terminated = terminated(s, r.idPrefix)
			default:
				st.State.Waiting = &corev1.ContainerStateWaiting{Reason: reasonContainerCreate}
			}
		} else {
			st.State.Waiting = &corev1.ContainerStateWaiting{Reason: notStarted}
		}
		if w, ok := r.waiting[c.Name]; ok {
			if st.State.Terminated != nil {
				st.LastTerminationState.Terminated = st.State.Terminated
			}
			st.State = corev1.ContainerState{Waiting: w}
		}
		out = append(out, st)
	}
	return out
}

func terminated(s containers.State, idPrefix string) *corev1.ContainerStateTerminated {
	t := &corev1.ContainerStateTerminated{
		ExitCode: int32(s.ExitCode), Reason: "Completed",
		StartedAt: metav1.NewTime(s.StartedAt), FinishedAt: metav1.NewTime(s.FinishedAt),
		ContainerID: idPrefix + s.ID,
	}
	if s.ExitCode != 0 {
		t.Reason = "Error"
	}
	return t
}

// phase is the pod's phase from its containers, as the kubelet's getPhase
// decides it.
func (r *podRun) phase(initDone bool) corev1.PodPhase {
	if r.failed {
		return corev1.PodFailed
	}
	if !initDone {
		return corev1.PodPending
	}
	var running, notStarted, succeeded, failed int
	for _, c := range r.pod.Spec.Containers {
		s, ok := r.have[c.Name]
		switch {
		case !ok || s.Status == containers.StatusCreated || s.Status == containers.StatusUnknown:
			notStarted++
		case s.Status == containers.StatusRunning:
			running++
		case s.ExitCode == 0:
			succeeded++
		default:
			failed++
		}
	}
	switch {
	case running > 0:
		return corev1.PodRunning
	case notStarted > 0:
		return corev1.PodPending
	case r.pod.Spec.RestartPolicy == corev1.RestartPolicyAlways:
		return corev1.PodRunning
	case failed == 0:
		return corev1.PodSucceeded
	case r.pod.Spec.RestartPolicy == corev1.RestartPolicyOnFailure:
		return corev1.PodRunning
	}
	return corev1.PodFailed
}
