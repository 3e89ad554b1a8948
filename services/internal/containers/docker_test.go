package containers

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/containerstest"
	"github.com/nodeplug/nodeplug/pkg/podlogs"
)

// The tests with the host's docker engine: each test's images, container
// names and labels are its own (containerstest.NewDocker), and all it
// made is removed when it ends. As with podman, the tests wait for
// states by polling with a deadline, never for a fixed time.

// newTestDocker is a Docker running containers with no network, and the
// test's images.
func newTestDocker(t *testing.T) (*Docker, *containerstest.Docker) {
	t.Helper()
	dk := containerstest.NewDocker(t)
	d, err := NewDocker(DockerConfig{Network: "none", CDISpecDirs: []string{t.TempDir()}})
	if err != nil {
		t.Fatalf("docker runs containers but NewDocker fails: %v", err)
	}
	if !strings.HasPrefix(d.Name(), "docker ") || len(d.Name()) <= len("docker ") {
		t.Errorf("Name() = %q, want docker and the engine's version", d.Name())
	}
	return d, dk
}

// dockerSpec is a container of the test's image named name (unique to
// the test), labelled testLabel=that name and with the test's RunLabel,
// logging to a file in dir.
func dockerSpec(dk *containerstest.Docker, dir, name string) Spec {
	n := dk.Name(name)
	return Spec{
		Name:       n,
		Labels:     map[string]string{testLabel: n, containerstest.RunLabel: dk.ID},
		Image:      dk.Image,
		PullPolicy: PullNever,
		LogPath:    podlogs.File(filepath.Join(dir, "pod"), name, 0),
	}
}

// runDockerToExit runs the container and waits for it to exit.
func runDockerToExit(t *testing.T, d *Docker, s Spec) State {
	t.Helper()
	id, err := d.Run(ctxT(t), s)
	if err != nil {
		t.Fatalf("Run %s: %v", s.Name, err)
	}
	st := waitState(t, d, s.Name, s.Name, "exited", exited)
	if st.ID != id {
		t.Errorf("List's container %s has ID %s, Run said %s", s.Name, st.ID, id)
	}
	return st
}

// mine is the test's containers.
func mine(t *testing.T, d *Docker, dk *containerstest.Docker) []State {
	t.Helper()
	list, err := d.List(ctxT(t), containerstest.RunLabel+"="+dk.ID)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

func TestDockerEnsureImage(t *testing.T) {
	t.Parallel()
	d, dk := newTestDocker(t)
	absent := "localhost/nodeplug-absent-" + dk.ID + ":1"
	for _, tc := range []struct {
		image, policy string
		want          error
	}{
		{dk.Image, PullNever, nil},
		{absent, PullNever, ErrImageNeverPull},
		// Present: not pulled (a pull of this name would fail).
		{dk.Image, PullIfNotPresent, nil},
		{unreachableImage, PullIfNotPresent, ErrImagePull},
		{unreachableImage, PullAlways, ErrImagePull},
		// Present, but pulled: Always.
		{dk.Image, PullAlways, ErrImagePull},
		// The API server's default for a tagged image: IfNotPresent.
		{dk.Image, "", nil},
	} {
		err := d.EnsureImage(ctxT(t), tc.image, tc.policy)
		if tc.want == nil && err != nil || !errors.Is(err, tc.want) {
			t.Errorf("EnsureImage(%s, %q) = %v, want %v", tc.image, tc.policy, err, tc.want)
			continue
		}
		var ce *CommandError
		if tc.want == ErrImagePull && (!errors.As(err, &ce) || !strings.Contains(err.Error(), "docker pull "+tc.image) || ce.Stderr == "") {
			t.Errorf("EnsureImage(%s, %q) = %v, want the error of docker pull with its stderr", tc.image, tc.policy, err)
		}
	}
	if err := d.EnsureImage(ctxT(t), dk.Image, "Sometimes"); err == nil || errors.Is(err, ErrImagePull) {
		t.Errorf("EnsureImage with policy Sometimes = %v, want an error about the policy", err)
	}
}

// Kubernetes' command and args against the image's ENTRYPOINT and CMD.
func TestDockerRunCommandAndArgs(t *testing.T) {
	t.Parallel()
	d, dk := newTestDocker(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name          string
		image         string
		command, args []string
		want          []string
	}{
		{"image-defaults", dk.Image, nil, nil, []string{"/ctrcmd", "from-entrypoint", "from-cmd"}},
		{"args-only", dk.Image, nil, []string{"a1", "--", "-x"}, []string{"/ctrcmd", "from-entrypoint", "a1", "--", "-x"}},
		{"command-only", dk.Image, []string{"/ctrcmd", "c1"}, nil, []string{"/ctrcmd", "c1"}},
		{"command-one-word", dk.Image, []string{"/ctrcmd"}, nil, []string{"/ctrcmd"}},
		{"command-and-args", dk.Image, []string{"/ctrcmd", "c1"}, []string{"a1", "a 2"}, []string{"/ctrcmd", "c1", "a1", "a 2"}},
		{"args-replace-cmd", dk.CmdImage, nil, []string{"/ctrcmd", "a1"}, []string{"/ctrcmd", "a1"}},
		{"cmd-image-defaults", dk.CmdImage, nil, nil, []string{"/ctrcmd", "from-cmd"}},
	} {
		s := dockerSpec(dk, dir, tc.name)
		s.Image, s.Command, s.Args = tc.image, tc.command, tc.args
		if st := runDockerToExit(t, d, s); st.ExitCode != 0 {
			t.Errorf("%s: exit code %d\n%s", tc.name, st.ExitCode, logOf(t, s, ""))
		}
		if got := argsOf(t, logOf(t, s, "stdout")); !slices.Equal(got, tc.want) {
			t.Errorf("%s: command %q args %q ran %q, want %q", tc.name, tc.command, tc.args, got, tc.want)
		}
	}
}

// The environment, the working directory, the mounts, a device, the
// labels, and both streams in the log linked from the layout.
func TestDockerRunSpec(t *testing.T) {
	t.Parallel()
	d, dk := newTestDocker(t)
	dir := t.TempDir()
	ro, rw := filepath.Join(dir, "ro"), filepath.Join(dir, "rw")
	for _, p := range []string{ro, rw} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(ro, "file"), "from the host")
	s := dockerSpec(dk, dir, "spec")
	s.Labels["other"] = "a=b, c"
	s.Env = []string{"A=1", "B=with space, comma", "A=2", "EMPTY="}
	s.WorkingDir = "/srv"
	s.Mounts = []Mount{{HostPath: ro, ContainerPath: "/ro", ReadOnly: true}, {HostPath: rw, ContainerPath: "/r,w"}}
	s.Devices = []Device{{HostPath: "/dev/null", ContainerPath: "/dev/nodeplug-null", Permissions: "rw"}}
	s.Args = []string{"env", "cwd", "cat=/ro/file", "write=/ro/new", "write=/r,w/new", "stat=/dev/nodeplug-null", "err=to stderr", "out=to stdout", "exit=3"}
	start := time.Now().Add(-time.Second) // the engine's clock is the host's
	st := runDockerToExit(t, d, s)
	if st.ExitCode != 3 || st.StartedAt.Before(start) || st.FinishedAt.Before(st.StartedAt) {
		t.Errorf("state %+v, want exit code 3, started after %s and finished after", st, start)
	}
	if st.Labels[testLabel] != s.Name || st.Labels["other"] != "a=b, c" || st.Labels[LabelLogLink] != s.LogPath {
		t.Errorf("labels %v, want those of the spec and the log's link", st.Labels)
	}
	if dest, err := os.Readlink(s.LogPath); err != nil || !strings.Contains(dest, st.ID) {
		t.Errorf("the log %s links to %q (%v), want docker's log of %s", s.LogPath, dest, err, st.ID)
	}

	checkSpecOutput(t, s, "/r,w", rw)
	s.Annotations = map[string]string{"a": "b"}
	s.Name = dk.Name("annotated")
	if _, err := d.Run(ctxT(t), s); err == nil || !strings.Contains(err.Error(), "annotations") {
		t.Errorf("Run with annotations = %v, want an error about them", err)
	}
}

// A container that cannot start leaves nothing behind: its name is free
// for the next.
func TestDockerRunStartFails(t *testing.T) {
	t.Parallel()
	d, dk := newTestDocker(t)
	dir := t.TempDir()
	s := dockerSpec(dk, dir, "nostart")
	s.Command = []string{"/no/such/program"}
	_, err := d.Run(ctxT(t), s)
	var ce *CommandError
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Command, "docker start") || ce.Stderr == "" {
		t.Fatalf("Run of a missing program = %v, want docker start's error", err)
	}
	if list := mine(t, d, dk); len(list) != 0 {
		t.Fatalf("the containers after a failed start = %+v, want none", list)
	}

	s.Command = nil
	s.CDIDevices = []string{"nodeplug.test/none=none"}
	if _, err := d.Run(ctxT(t), s); err == nil || !strings.Contains(err.Error(), "nodeplug.test/none=none") {
		t.Fatalf("Run with an unknown CDI device = %v, want an error naming it", err)
	}
	if list := mine(t, d, dk); len(list) != 0 {
		t.Fatalf("the containers after a failed create = %+v, want none", list)
	}

	// A working directory missing in the image is made (unlike
	// podman, docker makes it).
	s.CDIDevices = nil
	s.WorkingDir = "/made/by/docker"
	s.Args = []string{"cwd"}
	if st := runDockerToExit(t, d, s); st.ExitCode != 0 {
		t.Errorf("the container run again under the name: exit code %d", st.ExitCode)
	}
	if got := logOf(t, s, "stdout"); !strings.Contains(got, "cwd=/made/by/docker\n") {
		t.Errorf("stdout %q, want the working directory made", got)
	}
}

// A container listed running, stopped with SIGTERM, listed exited, found
// by another Docker (a dramanager started again), then removed, its log
// kept.
func TestDockerListStopRemove(t *testing.T) {
	t.Parallel()
	d, dk := newTestDocker(t)
	dir := t.TempDir()
	s := dockerSpec(dk, dir, "sleeper")
	s.Args = []string{"sleep", "exit=7"}
	id, err := d.Run(ctxT(t), s)
	if err != nil {
		t.Fatal(err)
	}
	other := dockerSpec(dk, dir, "other")
	other.Labels = map[string]string{"nodeplug.test/other": dk.ID, containerstest.RunLabel: dk.ID}
	if _, err := d.Run(ctxT(t), other); err != nil {
		t.Fatal(err)
	}

	st := stopWhenSleeping(t, d, s, id)

	// A container gone between docker ps and docker inspect is left out.
	if got, err := d.inspect(ctxT(t), id, dk.Name("never-was")); err != nil || len(got) != 1 || got[0].ID != id {
		t.Errorf("inspect of %s and a missing container = %+v, %v; want the first only", id, got, err)
	}

	again, err := NewDocker(DockerConfig{Network: "none"})
	if err != nil {
		t.Fatal(err)
	}
	if found := waitState(t, again, s.Name, s.Name, "exited", exited); found.ID != id || found.ExitCode != 7 || !found.FinishedAt.Equal(st.FinishedAt) {
		t.Errorf("another Docker lists %+v, want %+v", found, st)
	}

	for i := range 2 {
		if err := again.Remove(ctxT(t), id); err != nil {
			t.Errorf("Remove #%d: %v", i+1, err)
		}
	}
	if list, err := d.List(ctxT(t), testLabel+"="+s.Name); err != nil || len(list) != 0 {
		t.Errorf("List after Remove = %+v, %v; want none", list, err)
	}
	if list, err := d.List(ctxT(t), "nodeplug.test/other="+dk.ID); err != nil || len(list) != 1 || list[0].Name != other.Name {
		t.Errorf("List of the other label = %+v, %v; want the other container only", list, err)
	}
	if err := d.Stop(ctxT(t), id, time.Second); !errors.Is(err, ErrNotFound) {
		t.Errorf("Stop of a removed container = %v, want ErrNotFound", err)
	}
	// The log outlives the container: a file now, no longer a link.
	if fi, err := os.Lstat(s.LogPath); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("the log after Remove: %v, %v; want a file", fi, err)
	}
	if got := logOf(t, s, ""); !strings.HasSuffix(got, "sleeping\ngot SIGTERM\n") {
		t.Errorf("the log kept %q, want the container's", got)
	}
}

// Remove kills a running container, and keeps its log up to its end.
func TestDockerRemoveRunning(t *testing.T) {
	t.Parallel()
	d, dk := newTestDocker(t)
	s := dockerSpec(dk, t.TempDir(), "removed")
	s.Args = []string{"sleep"}
	id, err := d.Run(ctxT(t), s)
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, s, "sleeping\n")
	if err := d.Remove(ctxT(t), id); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if list := mine(t, d, dk); len(list) != 0 {
		t.Errorf("the containers after Remove = %+v, want none", list)
	}
	if got := logOf(t, s, ""); !strings.Contains(got, "sleeping\n") {
		t.Errorf("the log kept %q, want the container's", got)
	}
}
