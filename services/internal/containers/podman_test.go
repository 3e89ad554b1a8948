package containers

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/containerstest"
)

// The tests with a real podman, over storage of each test's own
// (containerstest), holding containerstest's images. Tests wait for
// states by polling with a deadline, never for a fixed time, and the
// deadlines are generous: a busy two-core machine passes.

const (
	testImage = containerstest.Image
	// cmdImage has a CMD and no ENTRYPOINT.
	cmdImage = containerstest.CmdImage
	// unreachableImage is on a registry that refuses connections at once.
	unreachableImage = "127.0.0.1:1/nodeplug/none:1"
	// testLabel is on every container the tests run.
	testLabel = "nodeplug.test/case"
)

// deadline bounds every podman command and every wait of the tests.
const deadline = containerstest.Deadline

// ctxT is a context ending at the tests' deadline, or with the test.
func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// newTestPodman is a Podman over storage of the test's own holding the
// test images, with no network for the containers.
func newTestPodman(t *testing.T) *Podman {
	t.Helper()
	st := containerstest.New(t)
	p, err := NewPodman(PodmanConfig{Env: st.Env, Network: "none"})
	if err != nil {
		t.Fatalf("podman runs containers but NewPodman fails: %v", err)
	}
	return p
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitState polls the containers labelled testLabel=value until the one
// named name is in a state cond accepts, and returns that state.
func waitState(t *testing.T, r Runtime, value, name, what string, cond func(State) bool) State {
	t.Helper()
	ctx := ctxT(t)
	var last []State
	for {
		list, err := r.List(ctx, testLabel+"="+value)
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		last = list
		for _, s := range list {
			if s.Name == name && cond(s) {
				return s
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("container %s is not %s after %s: the containers are %+v", name, what, deadline, last)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func exited(s State) bool { return s.Status == StatusExited }
