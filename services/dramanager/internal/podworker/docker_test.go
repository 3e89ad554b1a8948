package podworker_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodeplug/nodeplug/internal/containerstest"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/podlogs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/podworker"
	"github.com/nodeplug/nodeplug/services/internal/containers"
)

// The pods' containers run by the host's docker engine, with images of
// the test's own (containerstest.NewDocker): their IDs, their restarts'
// logs (docker's, linked, and kept when a restart replaces the
// container), and their removal with the pod.

// TestPodInDocker: a container failing under OnFailure is started again,
// each start's log readable, the first one's after docker removed its
// container; the IDs are docker's; deleting the pod removes its
// containers and logs.
func TestPodInDocker(t *testing.T) {
	t.Parallel()
	dk := containerstest.NewDocker(t)
	d, err := containers.NewDocker(containers.DockerConfig{Network: "none"})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvWith(t, d)
	e.create(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "run"}})
	p := ctrPod("crash", corev1.RestartPolicyOnFailure, []string{"out=init ran"}, []string{"out=crashing", "exit=3"})
	p.Spec.InitContainers[0].Image, p.Spec.Containers[0].Image = dk.Image, dk.Image
	e.create(p)
	p = e.waitPod("crash", "in CrashLoopBackOff", func(p *corev1.Pod) error {
		if len(p.Status.ContainerStatuses) != 1 {
			return fmt.Errorf("no container status")
		}
		st := p.Status.ContainerStatuses[0]
		if w := st.State.Waiting; w == nil || w.Reason != "CrashLoopBackOff" || st.RestartCount < 1 {
			return fmt.Errorf("state %+v, restarts %d", st.State, st.RestartCount)
		}
		if last := st.LastTerminationState.Terminated; last == nil || last.ExitCode != 3 || !strings.HasPrefix(last.ContainerID, "docker://") {
			return fmt.Errorf("last termination %+v", st.LastTerminationState)
		}
		return nil
	})
	if id := p.Status.InitContainerStatuses[0].ContainerID; !strings.HasPrefix(id, "docker://") || strings.HasPrefix(id, podworker.ContainerIDPrefix) {
		t.Errorf("the init container's ID %q, want docker://", id)
	}
	if log := e.logOf(p, "init", 0); log != "args=[\"/ctrcmd\",\"from-entrypoint\",\"out=init ran\"]\ninit ran\n" {
		t.Errorf("init's log: %q", log)
	}
	dir := podlogs.Dir(e.root, p.Namespace, p.Name, string(p.UID))
	for restart := range 2 {
		if log := e.logOf(p, "c0", restart); !strings.Contains(log, "crashing\n") {
			t.Errorf("start %d's log: %q", restart, log)
		}
	}
	// The first start's container was removed when the second started:
	// its log is a copy now.
	if fi, err := os.Lstat(podlogs.File(dir, "c0", 0)); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("the first start's log: %v, %v; want a file", fi, err)
	}

	if err := e.api.Client.CoreV1().Pods("run").Delete(context.Background(), "crash", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the deleted pod's containers and logs removed", func() error {
		if out := strings.TrimSpace(string(dk.Docker("ps", "-a", "--filter", "label="+podworker.LabelPodUID+"="+string(p.UID), "--format", "{{.Names}}"))); out != "" {
			return fmt.Errorf("docker still has %s", out)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			return fmt.Errorf("the pod's logs: %v", err)
		}
		return nil
	})
}
