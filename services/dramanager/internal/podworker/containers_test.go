package podworker_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodeplug/nodeplug/internal/containerstest"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/podlogs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/podworker"
	"github.com/nodeplug/nodeplug/services/internal/containers"
)

// The pods' containers, run by a real podman over storage of the test's
// own (containerstest's image: /ctrcmd, which does what its arguments
// say). The pods here have no claims: CDI devices in containers are
// test/upstream's (TestDRAPodRunsInPodman).

// podmanEnv is a node whose pod worker runs containers in podman.
func podmanEnv(t *testing.T) (*env, *containerstest.Storage) {
	t.Helper()
	st := containerstest.New(t)
	p, err := containers.NewPodman(containers.PodmanConfig{Env: st.Env, Network: "none"})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, p)
	e.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "run"}})
	return e, st
}

// ctrPod is a pod of containerstest's image whose containers are given
// those arguments (the image's entrypoint runs them).
func ctrPod(name string, policy corev1.RestartPolicy, init []string, args ...[]string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "run", Name: name}, Spec: corev1.PodSpec{
		RestartPolicy: policy, TerminationGracePeriodSeconds: ptr.To[int64](30)}}
	if init != nil {
		p.Spec.InitContainers = []corev1.Container{{Name: "init", Image: containerstest.Image, ImagePullPolicy: corev1.PullNever, Args: init}}
	}
	for i, a := range args {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("c%d", i),
			Image: containerstest.Image, ImagePullPolicy: corev1.PullNever, Args: a})
	}
	return p
}

// waitPod waits until cond holds of the pod, and returns it.
func (e *env) waitPod(name, what string, cond func(*corev1.Pod) error) *corev1.Pod {
	e.t.Helper()
	var p *corev1.Pod
	testutil.Eventually(e.t, "pod "+name+" "+what, func() error {
		p = e.pod("run", name)
		if err := cond(p); err != nil {
			return fmt.Errorf("%v (phase %s, statuses %+v %+v)", err, p.Status.Phase, p.Status.InitContainerStatuses, p.Status.ContainerStatuses)
		}
		return nil
	})
	return p
}

func phase(want corev1.PodPhase) func(*corev1.Pod) error {
	return func(p *corev1.Pod) error {
		if p.Status.Phase != want {
			return fmt.Errorf("phase %s, want %s", p.Status.Phase, want)
		}
		return nil
	}
}

// logOf is what the container of the pod printed in its restart-th start.
func (e *env) logOf(p *corev1.Pod, container string, restart int) string {
	e.t.Helper()
	f, err := os.Open(podlogs.File(podlogs.Dir(e.root, p.Namespace, p.Name, string(p.UID)), container, restart))
	if err != nil {
		e.t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var b bytes.Buffer
	if err := podlogs.Copy(&b, f, podlogs.Options{TailLines: -1}); err != nil {
		e.t.Fatal(err)
	}
	return b.String()
}

// TestPodContainersRun: the init container runs to its end before the app
// containers start; the containers get the pod's command, args and
// environment (with fieldRef and $(VAR) references); a pod whose
// containers all end with 0 under restartPolicy Never is Succeeded, with
// terminated states and the kubelet's events; the logs are in the
// kubelet's layout under the root dir.
func TestPodContainersRun(t *testing.T) {
	t.Parallel()
	e, _ := podmanEnv(t)
	p := ctrPod("once", corev1.RestartPolicyNever, []string{"out=init ran"}, []string{"env", "out=app ran"}, []string{"out=second ran"})
	p.Spec.Containers[0].Env = []corev1.EnvVar{
		{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "GREETING", Value: "hello $(POD), $$(POD) stays"},
	}
	e.create(p)
	p = e.waitPod("once", "Succeeded", phase(corev1.PodSucceeded))
	for _, st := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
		tm := st.State.Terminated
		if tm == nil || tm.ExitCode != 0 || tm.Reason != "Completed" || !strings.HasPrefix(st.ContainerID, podworker.ContainerIDPrefix) {
			t.Errorf("container %s: %+v (id %q), want terminated with 0, Completed", st.Name, st.State, st.ContainerID)
		}
	}
	init, app := p.Status.InitContainerStatuses[0].State.Terminated, p.Status.ContainerStatuses[0].State.Terminated
	if app.StartedAt.Before(&init.FinishedAt) {
		t.Errorf("the app container started at %s, before the init container ended at %s", app.StartedAt, init.FinishedAt)
	}
	if log := e.logOf(p, "init", 0); !strings.Contains(log, "init ran\n") {
		t.Errorf("init's log: %q", log)
	}
	log := e.logOf(p, "c0", 0)
	for _, want := range []string{"app ran\n", `"POD=once"`, `"GREETING=hello once, $(POD) stays"`} {
		if !strings.Contains(log, want) {
			t.Errorf("c0's log has no %s: %q", want, log)
		}
	}
	testutil.Eventually(t, "the kubelet's events", func() error {
		ev := e.events("run", "once")
		for _, r := range []string{podworker.ReasonScheduled, podworker.ReasonPulled, podworker.ReasonCreated, podworker.ReasonStarted} {
			if _, ok := ev[r]; !ok {
				return fmt.Errorf("no %s event in %v", r, ev)
			}
		}
		return nil
	})
}

// TestPodContainerRestarts: under OnFailure a container that fails is
// started again (a new start, its own log), then waits in
// CrashLoopBackOff with its last termination, and the pod is Running;
// under Never a failed container makes the pod Failed.
func TestPodContainerRestarts(t *testing.T) {
	t.Parallel()
	e, _ := podmanEnv(t)
	e.create(ctrPod("crash", corev1.RestartPolicyOnFailure, nil, []string{"out=crashing", "exit=3"}),
		ctrPod("fail", corev1.RestartPolicyNever, nil, []string{"exit=4"}))
	p := e.waitPod("crash", "in CrashLoopBackOff", func(p *corev1.Pod) error {
		if len(p.Status.ContainerStatuses) != 1 {
			return fmt.Errorf("no container status")
		}
		st := p.Status.ContainerStatuses[0]
		if w := st.State.Waiting; w == nil || w.Reason != "CrashLoopBackOff" || st.RestartCount < 1 {
			return fmt.Errorf("state %+v, restarts %d", st.State, st.RestartCount)
		}
		if last := st.LastTerminationState.Terminated; last == nil || last.ExitCode != 3 {
			return fmt.Errorf("last termination %+v", st.LastTerminationState)
		}
		return nil
	})
	if p.Status.Phase != corev1.PodRunning {
		t.Errorf("a pod restarting its container is %s, want Running", p.Status.Phase)
	}
	for restart := range 2 {
		if log := e.logOf(p, "c0", restart); !strings.Contains(log, "crashing\n") {
			t.Errorf("start %d's log: %q", restart, log)
		}
	}
	if ev := e.events("run", "crash"); ev[podworker.ReasonBackOff] == "" {
		t.Errorf("no BackOff event: %v", ev)
	}
	p = e.waitPod("fail", "Failed", phase(corev1.PodFailed))
	if tm := p.Status.ContainerStatuses[0].State.Terminated; tm == nil || tm.ExitCode != 4 || tm.Reason != "Error" {
		t.Errorf("the failed container: %+v", p.Status.ContainerStatuses[0].State)
	}
}

// TestPodImageNeverPulled: an image absent with imagePullPolicy Never
// leaves the container waiting with ErrImageNeverPull, and an event says
// so; the pod stays Pending.
func TestPodImageNeverPulled(t *testing.T) {
	t.Parallel()
	e, _ := podmanEnv(t)
	p := ctrPod("absent", corev1.RestartPolicyAlways, nil, nil)
	p.Spec.Containers = []corev1.Container{{Name: "c0", Image: "localhost/not-here:1", ImagePullPolicy: corev1.PullNever}}
	e.create(p)
	e.waitPod("absent", "waiting for its image", func(p *corev1.Pod) error {
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Waiting == nil ||
			p.Status.ContainerStatuses[0].State.Waiting.Reason != podworker.ReasonErrImageNever {
			return fmt.Errorf("not waiting with ErrImageNeverPull")
		}
		return phase(corev1.PodPending)(p)
	})
	testutil.Eventually(t, "the ErrImageNeverPull event", func() error {
		if ev := e.events("run", "absent")[podworker.ReasonErrImageNever]; !strings.Contains(ev, "localhost/not-here:1") {
			return fmt.Errorf("event %q", ev)
		}
		return nil
	})
}

// TestPodRunningAcrossRestartAndDeleted: a running container is adopted
// by a pod worker started again (not started twice); deleting the pod
// stops and removes its containers and its logs.
func TestPodRunningAcrossRestartAndDeleted(t *testing.T) {
	t.Parallel()
	e, st := podmanEnv(t)
	e.create(ctrPod("sleeper", corev1.RestartPolicyAlways, nil, []string{"sleep"}))
	running := func(p *corev1.Pod) error {
		if len(p.Status.ContainerStatuses) != 1 || p.Status.ContainerStatuses[0].State.Running == nil || !p.Status.ContainerStatuses[0].Ready {
			return fmt.Errorf("not running and ready")
		}
		return phase(corev1.PodRunning)(p)
	}
	p := e.waitPod("sleeper", "Running", running)
	id := p.Status.ContainerStatuses[0].ContainerID
	e.stop()
	e.start()
	p = e.waitPod("sleeper", "still Running", running)
	if got := p.Status.ContainerStatuses[0]; got.ContainerID != id || got.RestartCount != 0 {
		t.Errorf("after the worker's restart the container is %s (restarts %d), want %s adopted", got.ContainerID, got.RestartCount, id)
	}
	if err := e.api.Client.CoreV1().Pods("run").Delete(context.Background(), "sleeper", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	logs := podlogs.Dir(e.root, "run", "sleeper", string(p.UID))
	testutil.Eventually(t, "the deleted pod's container and logs removed", func() error {
		if out := strings.TrimSpace(string(st.Podman("ps", "-a", "--filter", "label="+podworker.LabelPodUID+"="+string(p.UID), "--format", "{{.Names}}"))); out != "" {
			return fmt.Errorf("podman still has %s", out)
		}
		if _, err := os.Stat(logs); !os.IsNotExist(err) {
			return fmt.Errorf("%s: %v", filepath.Base(logs), err)
		}
		return nil
	})
}

// TestPodSidecar: a sidecar (an init container with restartPolicy Always)
// is started before the app container and runs beside it; when the app
// container ends the pod Succeeded and the sidecar is stopped.
func TestPodSidecar(t *testing.T) {
	t.Parallel()
	e, _ := podmanEnv(t)
	p := ctrPod("sidecar", corev1.RestartPolicyNever, []string{"out=sidecar up", "sleep"}, []string{"out=app ran"})
	p.Spec.InitContainers[0].RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
	e.create(p)
	p = e.waitPod("sidecar", "Succeeded with its sidecar stopped", func(p *corev1.Pod) error {
		if err := phase(corev1.PodSucceeded)(p); err != nil {
			return err
		}
		if len(p.Status.InitContainerStatuses) != 1 || p.Status.InitContainerStatuses[0].State.Terminated == nil {
			return fmt.Errorf("the sidecar has not been stopped")
		}
		return nil
	})
	side, app := p.Status.InitContainerStatuses[0].State.Terminated, p.Status.ContainerStatuses[0].State.Terminated
	if app == nil || app.ExitCode != 0 || app.StartedAt.Before(&side.StartedAt) || side.FinishedAt.Before(&app.FinishedAt) {
		t.Errorf("sidecar %+v, app %+v: want the app started after the sidecar and ended before it", side, app)
	}
	if log := e.logOf(p, "init", 0); !strings.Contains(log, "got SIGTERM") {
		t.Errorf("the sidecar's log: %q, want it stopped with SIGTERM", log)
	}
}
