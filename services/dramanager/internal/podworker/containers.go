package podworker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nodeplug/nodeplug/pkg/podlogs"
	"github.com/nodeplug/nodeplug/services/internal/containers"
)

// The containers of a pod, run through a container runtime as the kubelet
// runs them: init containers one after the other to completion, then the
// app containers, each restarted as the pod's restartPolicy says with the
// kubelet's back-off, their states written to the pod's status.

// The labels of the containers the worker runs: the pod and the container
// they belong to (the names the kubelet's runtimes use), and which start
// of the container it is.
const (
	LabelPodUID        = "io.kubernetes.pod.uid"
	LabelPodName       = "io.kubernetes.pod.name"
	LabelPodNamespace  = "io.kubernetes.pod.namespace"
	LabelContainerName = "io.kubernetes.container.name"
	LabelRestartCount  = "io.nodeplug.restart-count"
)

// The kubelet's event reasons for containers.
const (
	ReasonPulled          = "Pulled"
	ReasonPulling         = "Pulling"
	ReasonErrImageNever   = "ErrImageNeverPull"
	ReasonFailed          = "Failed"
	ReasonCreated         = "Created"
	ReasonStarted         = "Started"
	ReasonKilling         = "Killing"
	ReasonBackOff         = "BackOff"
	reasonCrashLoop       = "CrashLoopBackOff"
	reasonErrImagePull    = "ErrImagePull"
	reasonCreateError     = "CreateContainerError"
	reasonContainerCreate = "ContainerCreating"
	reasonPodInitializing = "PodInitializing"
)

// containerPoll is how often the containers of a pod with a container
// running, or waiting to restart, are looked at again.
const containerPoll = time.Second

// listFresh is how long one listing of the runtime's containers answers
// for every pod: a pass over many pods asks the runtime once.
const listFresh = 500 * time.Millisecond

// The kubelet's restart back-off: a container that ended is started again
// at once the first time, then after 10 s, doubling up to 5 min.
const (
	backOffInitial = 10 * time.Second
	backOffMax     = 5 * time.Minute
)

// requeue is sync's answer (possibly wrapped) when the pod is to be
// looked at again after a while, not as a failure: while its containers
// run, while one waits to restart, while a released pod's claim is being
// unprepared.
type requeue time.Duration

func (r requeue) Error() string { return "looked at again in " + time.Duration(r).String() }

// containerList caches the runtime's containers for listFresh.
type containerList struct {
	mu   sync.Mutex
	at   time.Time
	list []containers.State
}

// runtimeContainers returns the runtime's containers of pod uid, the
// latest start of each container by name.
func (w *Worker) runtimeContainers(ctx context.Context, uid types.UID, fresh bool) (map[string]containers.State, error) {
	cl := &w.ctrs
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if fresh || time.Since(cl.at) > listFresh {
		list, err := w.cfg.Runtime.List(ctx, LabelPodUID)
		if err != nil {
			return nil, fmt.Errorf("listing the containers of %s: %w", w.cfg.Runtime.Name(), err)
		}
		cl.list, cl.at = list, time.Now()
	}
	out := map[string]containers.State{}
	for _, s := range cl.list {
		if s.Labels[LabelPodUID] != string(uid) {
			continue
		}
		name := s.Labels[LabelContainerName]
		if cur, ok := out[name]; !ok || restartCount(s) > restartCount(cur) {
			out[name] = s
		}
	}
	return out, nil
}

// invalidate makes the next listing ask the runtime.
func (w *Worker) invalidate() {
	w.ctrs.mu.Lock()
	w.ctrs.at = time.Time{}
	w.ctrs.mu.Unlock()
}

func restartCount(s containers.State) int {
	n, _ := strconv.Atoi(s.Labels[LabelRestartCount])
	return n
}

// podRun is one look at a pod's containers: what the runtime holds, and
// the statuses being written.
type podRun struct {
	// idPrefix begins the containers' IDs in their statuses.
	idPrefix string
	pod      *corev1.Pod
	cdi      map[string][]string
	have     map[string]containers.State
	waiting  map[string]*corev1.ContainerStateWaiting
	failed   bool
	nextLook time.Duration
}

func (r *podRun) later(d time.Duration) {
	if r.nextLook == 0 || d < r.nextLook {
		r.nextLook = d
	}
}

// syncContainers brings the pod's containers one step further and writes
// their states. cdi is each container's CDI devices.
func (w *Worker) syncContainers(ctx context.Context, pod *corev1.Pod, cdi map[string][]string) error {
	have, err := w.runtimeContainers(ctx, pod.UID, false)
	if err != nil {
		return err
	}
	if have, err = w.dropStale(ctx, pod.UID, have); err != nil {
		return err
	}
	r := &podRun{
		pod: pod, cdi: cdi, have: have, waiting: map[string]*corev1.ContainerStateWaiting{},
		idPrefix: containerIDPrefix(w.cfg.Runtime.Name()),
	}
	initDone := w.stepInit(ctx, r)
	if initDone && !r.failed {
		for _, c := range pod.Spec.Containers {
			w.stepContainer(ctx, r, c, restartOf(pod.Spec.RestartPolicy))
		}
	}
	if ph := r.phase(initDone); ph == corev1.PodSucceeded || ph == corev1.PodFailed {
		// The pod is done: what still runs (its sidecars) is stopped.
		if err := w.stopRunning(ctx, r); err != nil {
			return err
		}
	}
	if err := w.updateStatus(ctx, pod, func(st *corev1.PodStatus) { r.status(st, initDone) }); err != nil {
		return err
	}
	if r.nextLook > 0 {
		return requeue(r.nextLook)
	}
	return nil
}

// sidecar says whether c is a sidecar: an init container that runs beside
// the app containers.
func sidecar(c corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

func conditionTrue(pod *corev1.Pod, t corev1.PodConditionType) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// stopRunning stops the pod's containers that run, and lists them again.
func (w *Worker) stopRunning(ctx context.Context, r *podRun) error {
	stopped := false
	for name, s := range r.have {
		if s.Status != containers.StatusRunning {
			continue
		}
		w.recorder.Eventf(r.pod, corev1.EventTypeNormal, ReasonKilling, "Stopping container %s", name)
		if err := w.cfg.Runtime.Stop(ctx, s.ID, time.Duration(grace(r.pod))*time.Second); err != nil && !errors.Is(err, containers.ErrNotFound) {
			return fmt.Errorf("stopping container %s of pod %s/%s: %w", name, r.pod.Namespace, r.pod.Name, err)
		}
		stopped = true
	}
	if !stopped {
		return nil
	}
	have, err := w.runtimeContainers(ctx, r.pod.UID, true)
	if err != nil {
		return err
	}
	r.have = have
	return nil
}

// dropStale removes the containers of the pod that were created and never
// started: Run starts what it creates before it returns, and a pod is
// worked on by one sync at a time, so such a container is what a
// dramanager killed between the two left (or a listing taken in between:
// the containers are listed again first). They are started anew.
func (w *Worker) dropStale(ctx context.Context, uid types.UID, have map[string]containers.State) (map[string]containers.State, error) {
	stale := func(have map[string]containers.State) bool {
		for _, s := range have {
			if s.Status == containers.StatusCreated {
				return true
			}
		}
		return false
	}
	if !stale(have) {
		return have, nil
	}
	have, err := w.runtimeContainers(ctx, uid, true)
	if err != nil {
		return nil, err
	}
	removed := false
	for _, s := range have {
		if s.Status != containers.StatusCreated {
			continue
		}
		w.log.Info("removing a container created and never started", "container", s.Name)
		if err := w.cfg.Runtime.Remove(ctx, s.ID); err != nil {
			return nil, fmt.Errorf("removing container %s, created and never started: %w", s.Name, err)
		}
		removed = true
	}
	if !removed {
		return have, nil
	}
	// The start before the removed one, if any, is the latest again.
	return w.runtimeContainers(ctx, uid, true)
}

// restartOf says when a container of a pod with that policy is started
// again after it ended with an exit code.
func restartOf(policy corev1.RestartPolicy) func(exit int) bool {
	switch policy {
	case corev1.RestartPolicyNever:
		return func(int) bool { return false }
	case corev1.RestartPolicyOnFailure:
		return func(exit int) bool { return exit != 0 }
	}
	return func(int) bool { return true }
}

// stepInit runs the init containers in order, each to its successful end,
// and says whether all have ended so. An init container that failed is run
// again unless the pod's restartPolicy is Never; then the pod has failed.
// A sidecar (an init container with restartPolicy Always) counts once it
// runs, and is restarted whenever it ends; once the pod is initialized,
// only its sidecars are looked at again.
func (w *Worker) stepInit(ctx context.Context, r *podRun) bool {
	initialized := conditionTrue(r.pod, corev1.PodInitialized)
	for _, c := range r.pod.Spec.InitContainers {
		s, ok := r.have[c.Name]
		if sidecar(c) {
			if !ok || s.Status != containers.StatusRunning {
				w.stepContainer(ctx, r, c, func(int) bool { return true })
				if !initialized {
					return false
				}
			}
			continue
		}
		if initialized || ok && s.Status == containers.StatusExited && s.ExitCode == 0 {
			continue
		}
		if ok && s.Status == containers.StatusExited && r.pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
			r.failed = true
			return false
		}
		w.stepContainer(ctx, r, c, func(exit int) bool { return exit != 0 })
		return false
	}
	return true
}

// stepContainer starts c when it has no container yet, or when its last
// one ended and restart says so and its back-off has passed.
func (w *Worker) stepContainer(ctx context.Context, r *podRun, c corev1.Container, restart func(int) bool) {
	s, ok := r.have[c.Name]
	next := 0
	switch {
	case !ok:
	case s.Status == containers.StatusRunning || s.Status == containers.StatusCreated:
		r.later(containerPoll)
		return
	case s.Status == containers.StatusExited && !restart(s.ExitCode):
		return
	default:
		next = restartCount(s) + 1
		if wait := restartBackOff(restartCount(s)) - time.Since(s.FinishedAt); wait > 0 {
			msg := fmt.Sprintf("back-off %s restarting failed container=%s pod=%s_%s(%s)", restartBackOff(restartCount(s)), c.Name, r.pod.Name, r.pod.Namespace, r.pod.UID)
			r.waiting[c.Name] = &corev1.ContainerStateWaiting{Reason: reasonCrashLoop, Message: msg}
			w.recorder.Event(r.pod, corev1.EventTypeWarning, ReasonBackOff, "Back-off restarting failed container "+c.Name+" in pod "+r.pod.Name+"_"+r.pod.Namespace+"("+string(r.pod.UID)+")")
			r.later(wait)
			return
		}
	}
	if st := w.start(ctx, r, c, next); st != nil {
		r.waiting[c.Name] = st
		r.later(restartBackOff(next))
		return
	}
	if ok {
		// The ended container's log stays (its own file); the container
		// itself is replaced by the new one.
		if err := w.cfg.Runtime.Remove(ctx, s.ID); err != nil {
			w.log.Warn("removing an ended container", "container", s.Name, "error", err)
		}
	}
	r.later(containerPoll)
}

// restartBackOff is how long after its end a container started restarts
// times is started again.
func restartBackOff(restarts int) time.Duration {
	switch {
	case restarts <= 0:
		return 0
	case restarts > 6: // 10 s doubled 5 times is past backOffMax already
		return backOffMax
	}
	return min(backOffInitial<<(restarts-1), backOffMax)
}

// start makes sure of c's image and runs its restart-th container, with
// events as the kubelet records them. It returns the waiting state to
// report when the container could not be started.
func (w *Worker) start(ctx context.Context, r *podRun, c corev1.Container, restart int) *corev1.ContainerStateWaiting {
	pod := r.pod
	if err := w.cfg.Runtime.EnsureImage(ctx, c.Image, string(c.ImagePullPolicy)); err != nil {
		switch {
		case errors.Is(err, containers.ErrImageNeverPull):
			msg := fmt.Sprintf("Container image %q is not present with pull policy of Never", c.Image)
			w.recorder.Event(pod, corev1.EventTypeWarning, ReasonErrImageNever, msg)
			return &corev1.ContainerStateWaiting{Reason: ReasonErrImageNever, Message: msg}
		default:
			msg := message(fmt.Sprintf("Failed to pull image %q: %v", c.Image, err))
			w.recorder.Event(pod, corev1.EventTypeWarning, ReasonFailed, msg)
			return &corev1.ContainerStateWaiting{Reason: reasonErrImagePull, Message: msg}
		}
	}
	if c.ImagePullPolicy != corev1.PullAlways {
		w.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonPulled, "Container image %q already present on machine", c.Image)
	}
	cdi := r.cdi[c.Name]
	var err error
	if w.cfg.Devices != nil {
		// The devicemanager's answer: the device plugins' CDI devices and
		// the claims'.
		cdi, err = w.cfg.Devices.StartContainer(ctx, string(pod.UID), c.Name)
	}
	var spec containers.Spec
	if err == nil {
		spec, err = w.containerSpec(pod, c, cdi, restart)
	}
	if err == nil {
		_, err = w.cfg.Runtime.Run(ctx, spec)
	}
	w.invalidate()
	if err != nil {
		msg := message("Error: " + err.Error())
		w.recorder.Event(pod, corev1.EventTypeWarning, ReasonFailed, msg)
		return &corev1.ContainerStateWaiting{Reason: reasonCreateError, Message: msg}
	}
	w.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonCreated, "Created container: %s", c.Name)
	w.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonStarted, "Started container %s", c.Name)
	return nil
}

// containerSpec is what the runtime is given for c's restart-th start.
func (w *Worker) containerSpec(pod *corev1.Pod, c corev1.Container, cdi []string, restart int) (containers.Spec, error) {
	env, err := containerEnv(pod, c)
	if err != nil {
		return containers.Spec{}, err
	}
	return containers.Spec{
		Name: containerName(pod, c.Name, restart),
		Labels: map[string]string{
			LabelPodUID: string(pod.UID), LabelPodName: pod.Name, LabelPodNamespace: pod.Namespace,
			LabelContainerName: c.Name, LabelRestartCount: strconv.Itoa(restart),
		},
		Image: c.Image, PullPolicy: string(c.ImagePullPolicy),
		Command: c.Command, Args: c.Args, WorkingDir: c.WorkingDir, Env: env,
		CDIDevices: cdi,
		LogPath:    podlogs.File(podlogs.Dir(w.cfg.RootDir, pod.Namespace, pod.Name, string(pod.UID)), c.Name, restart),
	}, nil
}

// containerName is the runtime's name of a container's restart-th start:
// the kubelet's dockershim naming, unique per pod UID and start.
func containerName(pod *corev1.Pod, container string, restart int) string {
	return fmt.Sprintf("k8s_%s_%s_%s_%s_%d", container, pod.Name, pod.Namespace, pod.UID, restart)
}

// containerEnv is c's environment: its variables with values, and those
// taken from the pod's own fields (the downward API's fieldRef) that a
// pod on one node has. Any other source is an error naming it.
func containerEnv(pod *corev1.Pod, c corev1.Container) ([]string, error) {
	if len(c.EnvFrom) > 0 {
		return nil, fmt.Errorf("envFrom of container %s: ConfigMaps and Secrets are not served by the node-local API", c.Name)
	}
	var env []string
	for _, e := range c.Env {
		v := e.Value
		if e.ValueFrom != nil {
			f := e.ValueFrom.FieldRef
			if f == nil {
				return nil, fmt.Errorf("env %s of container %s: only values and fieldRef are supported", e.Name, c.Name)
			}
			switch f.FieldPath {
			case "metadata.name":
				v = pod.Name
			case "metadata.namespace":
				v = pod.Namespace
			case "metadata.uid":
				v = string(pod.UID)
			case "spec.nodeName":
				v = pod.Spec.NodeName
			case "spec.serviceAccountName":
				v = pod.Spec.ServiceAccountName
			default:
				return nil, fmt.Errorf("env %s of container %s: fieldRef %s is not supported", e.Name, c.Name, f.FieldPath)
			}
		}
		env = append(env, e.Name+"="+expand(v, env))
	}
	return env, nil
}

// expand replaces $(NAME) in v by the value of a variable defined before
// it, as the kubelet does; $$ is a literal $, and a reference to an
// undefined variable is kept as written.
func expand(v string, env []string) string {
	if !strings.Contains(v, "$") {
		return v
	}
	lookup := func(name string) (string, bool) {
		for _, kv := range slices.Backward(env) {
			if k, val, _ := strings.Cut(kv, "="); k == name {
				return val, true
			}
		}
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] != '$' || i+1 >= len(v) {
			b.WriteByte(v[i])
			continue
		}
		switch v[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(v[i:], ')')
			if end < 0 {
				b.WriteString(v[i:])
				return b.String()
			}
			name := v[i+2 : i+end]
			if val, ok := lookup(name); ok {
				b.WriteString(val)
			} else {
				b.WriteString(v[i : i+end+1])
			}
			i += end
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// stopContainers stops and removes every container of pod uid (grace:
// how long each is given after SIGTERM), and its logs.
func (w *Worker) stopContainers(ctx context.Context, uid types.UID, ref podRef, pod *corev1.Pod) error {
	have, err := w.runtimeContainers(ctx, uid, true)
	if err != nil {
		return err
	}
	grace := time.Duration(ref.Grace) * time.Second
	for name, s := range have {
		if s.Status == containers.StatusRunning || s.Status == containers.StatusCreated {
			if pod != nil {
				w.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonKilling, "Stopping container %s", name)
			}
			if err := w.cfg.Runtime.Stop(ctx, s.ID, grace); err != nil && !errors.Is(err, containers.ErrNotFound) {
				return fmt.Errorf("stopping container %s of pod %s: %w", name, ref.key(), err)
			}
		}
	}
	// The logs of a pod that is gone go first: a runtime whose removal
	// keeps a container's log (docker's, linked) then has none to copy.
	if pod == nil {
		if err := os.RemoveAll(podlogs.Dir(w.cfg.RootDir, ref.Namespace, ref.Name, string(uid))); err != nil {
			w.log.Warn("removing the logs of a deleted pod", "pod", ref.key(), "error", err)
		}
	}
	// Every start of every container, the ended ones too.
	w.ctrs.mu.Lock()
	all := slices.Clone(w.ctrs.list)
	w.ctrs.mu.Unlock()
	for _, s := range all {
		if s.Labels[LabelPodUID] == string(uid) {
			if err := w.cfg.Runtime.Remove(ctx, s.ID); err != nil {
				return fmt.Errorf("removing container %s of pod %s: %w", s.Name, ref.key(), err)
			}
		}
	}
	w.invalidate()
	return nil
}
