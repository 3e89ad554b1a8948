package containers

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/pkg/podlogs"
)

// runSpec is a container of the test image labelled testLabel=name,
// logging to a file in dir.
func runSpec(dir, name string) Spec {
	return Spec{
		Name:       name,
		Labels:     map[string]string{testLabel: name},
		Image:      testImage,
		PullPolicy: PullNever,
		LogPath:    podlogs.File(filepath.Join(dir, "pod"), name, 0),
	}
}

// runToExit runs the container and waits for it to exit.
func runToExit(t *testing.T, p *Podman, s Spec) State {
	t.Helper()
	id, err := p.Run(ctxT(t), s)
	if err != nil {
		t.Fatalf("Run %s: %v", s.Name, err)
	}
	st := waitState(t, p, s.Name, s.Name, "exited", exited)
	if st.ID != id {
		t.Errorf("List's container %s has ID %s, Run said %s", s.Name, st.ID, id)
	}
	return st
}

// logOf is the container's log: the stream's lines ("" for both), read
// by podlogs.
// checkSpecOutput checks what the probe printed, run with the spec of
// TestRunSpec and TestDockerRunSpec: the env in order (the later A
// wins), the working dir, the read-only mount refusing a write, the
// read-write one (rwCtr in the container, rwHost on the host) taking it,
// the device, and both streams.
func checkSpecOutput(t *testing.T, s Spec, rwCtr, rwHost string) {
	t.Helper()
	stdout := logOf(t, s, "stdout")
	var env []string
	for _, line := range strings.Split(stdout, "\n") {
		if v, ok := strings.CutPrefix(line, "env="); ok {
			if err := json.Unmarshal([]byte(v), &env); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, want := range []string{"A=2", "B=with space, comma", "EMPTY="} {
		if !slices.Contains(env, want) {
			t.Errorf("env %q, want %s", env, want)
		}
	}
	if slices.Contains(env, "A=1") {
		t.Errorf("env %q: the later A wins", env)
	}
	for _, want := range []string{
		"cwd=/srv\n",
		"cat /ro/file=from the host\n",
		"write /ro/new=error: open /ro/new: read-only file system\n",
		"write " + rwCtr + "/new=ok\n",
		"stat /dev/nodeplug-null=char device\n",
		"to stdout\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout %q, want %q", stdout, want)
		}
	}
	if got := logOf(t, s, "stderr"); got != "to stderr\n" {
		t.Errorf("stderr %q, want \"to stderr\\n\"", got)
	}
	if _, err := os.Stat(filepath.Join(rwHost, "new")); err != nil {
		t.Errorf("the file written in the read-write mount: %v", err)
	}
}

func logOf(t *testing.T, s Spec, stream string) string {
	t.Helper()
	f, err := os.Open(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	var out bytes.Buffer
	if err := podlogs.Copy(&out, f, podlogs.Options{Stream: stream, TailLines: -1}); err != nil {
		t.Fatalf("the log of %s: %v", s.Name, err)
	}
	return out.String()
}

// argsOf is the arguments the program printed first.
func argsOf(t *testing.T, log string) []string {
	t.Helper()
	first, _, _ := strings.Cut(log, "\n")
	var args []string
	if err := json.Unmarshal([]byte(strings.TrimPrefix(first, "args=")), &args); err != nil {
		t.Fatalf("the program's arguments in %q: %v", first, err)
	}
	return args
}

func TestEnsureImage(t *testing.T) {
	t.Parallel()
	p := newTestPodman(t)
	for _, tc := range []struct {
		image, policy string
		want          error
	}{
		{testImage, PullNever, nil},
		{"localhost/nodeplug-absent:1", PullNever, ErrImageNeverPull},
		// Present: not pulled (a pull of this name would fail).
		{testImage, PullIfNotPresent, nil},
		{unreachableImage, PullIfNotPresent, ErrImagePull},
		{unreachableImage, PullAlways, ErrImagePull},
		// The API server's default for a tagged image: IfNotPresent.
		{testImage, "", nil},
	} {
		err := p.EnsureImage(ctxT(t), tc.image, tc.policy)
		if tc.want == nil && err != nil || !errors.Is(err, tc.want) {
			t.Errorf("EnsureImage(%s, %q) = %v, want %v", tc.image, tc.policy, err, tc.want)
			continue
		}
		var ce *CommandError
		if tc.want == ErrImagePull && (!errors.As(err, &ce) || !strings.Contains(err.Error(), "podman pull "+tc.image) || ce.Stderr == "") {
			t.Errorf("EnsureImage(%s, %q) = %v, want the error of podman pull with its stderr", tc.image, tc.policy, err)
		}
	}
	if err := p.EnsureImage(ctxT(t), testImage, "Sometimes"); err == nil || errors.Is(err, ErrImagePull) {
		t.Errorf("EnsureImage with policy Sometimes = %v, want an error about the policy", err)
	}
}

// Kubernetes' command and args against the image's ENTRYPOINT and CMD.
func TestRunCommandAndArgs(t *testing.T) {
	t.Parallel()
	p := newTestPodman(t)
	dir := t.TempDir()
	for _, tc := range []struct {
		name          string
		image         string
		command, args []string
		want          []string
	}{
		{"image-defaults", testImage, nil, nil, []string{"/ctrcmd", "from-entrypoint", "from-cmd"}},
		{"args-only", testImage, nil, []string{"a1", "--", "-x"}, []string{"/ctrcmd", "from-entrypoint", "a1", "--", "-x"}},
		{"command-only", testImage, []string{"/ctrcmd", "c1"}, nil, []string{"/ctrcmd", "c1"}},
		{"command-and-args", testImage, []string{"/ctrcmd", "c1"}, []string{"a1", "a 2"}, []string{"/ctrcmd", "c1", "a1", "a 2"}},
		{"args-replace-cmd", cmdImage, nil, []string{"/ctrcmd", "a1"}, []string{"/ctrcmd", "a1"}},
		{"cmd-image-defaults", cmdImage, nil, nil, []string{"/ctrcmd", "from-cmd"}},
	} {
		s := runSpec(dir, tc.name)
		s.Image, s.Command, s.Args = tc.image, tc.command, tc.args
		if st := runToExit(t, p, s); st.ExitCode != 0 {
			t.Errorf("%s: exit code %d\n%s", tc.name, st.ExitCode, logOf(t, s, ""))
		}
		if got := argsOf(t, logOf(t, s, "stdout")); !slices.Equal(got, tc.want) {
			t.Errorf("%s: command %q args %q ran %q, want %q", tc.name, tc.command, tc.args, got, tc.want)
		}
	}
}

// The environment, the working directory, the mounts, a device, the
// labels and annotations, and both streams in the log.
func TestRunSpec(t *testing.T) {
	t.Parallel()
	p := newTestPodman(t)
	dir := t.TempDir()
	ro, rw := filepath.Join(dir, "ro"), filepath.Join(dir, "rw")
	for _, d := range []string{ro, rw} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(ro, "file"), "from the host")
	s := runSpec(dir, "spec")
	s.Labels["other"] = "a=b, c"
	s.Annotations = map[string]string{"note": "a,b \"c\"", "plain": "1"}
	s.Env = []string{"A=1", "B=with space, comma", "A=2", "EMPTY="}
	s.WorkingDir = "/srv"
	s.Mounts = []Mount{{HostPath: ro, ContainerPath: "/ro", ReadOnly: true}, {HostPath: rw, ContainerPath: "/rw"}}
	s.Devices = []Device{{HostPath: "/dev/null", ContainerPath: "/dev/nodeplug-null", Permissions: "rw"}}
	s.Args = []string{"env", "cwd", "cat=/ro/file", "write=/ro/new", "write=/rw/new", "stat=/dev/nodeplug-null", "err=to stderr", "out=to stdout", "exit=3"}
	start := time.Now().Add(-2 * time.Second) // podman's times are whole seconds
	st := runToExit(t, p, s)
	if st.ExitCode != 3 || st.StartedAt.Before(start) || st.FinishedAt.Before(st.StartedAt) {
		t.Errorf("state %+v, want exit code 3, started after %s and finished after", st, start)
	}
	if st.Labels[testLabel] != "spec" || st.Labels["other"] != "a=b, c" {
		t.Errorf("labels %v, want those of the spec", st.Labels)
	}

	checkSpecOutput(t, s, "/rw", rw)
	out, err := p.command(ctxT(t), "podman inspect", "inspect", "--format", "{{json .Config.Annotations}}", st.ID)
	if err != nil {
		t.Fatal(err)
	}
	var ann map[string]string
	if err := json.Unmarshal(out, &ann); err != nil || ann["note"] != "a,b \"c\"" || ann["plain"] != "1" {
		t.Errorf("annotations %s (%v), want those of the spec", out, err)
	}
}

// A container that cannot start leaves nothing behind: its name is free
// for the next.
func TestRunStartFails(t *testing.T) {
	t.Parallel()
	p := newTestPodman(t)
	dir := t.TempDir()
	s := runSpec(dir, "nostart")
	s.WorkingDir = "/no/such/dir" // podman 4.3.1 does not make it: the start fails
	_, err := p.Run(ctxT(t), s)
	var ce *CommandError
	if !errors.As(err, &ce) || !strings.HasPrefix(ce.Command, "podman start") || ce.Stderr == "" {
		t.Fatalf("Run with a missing working dir = %v, want podman start's error", err)
	}
	if list, err := p.List(ctxT(t), testLabel); err != nil || len(list) != 0 {
		t.Fatalf("List after a failed start = %+v, %v; want no container", list, err)
	}

	s.WorkingDir = ""
	s.CDIDevices = []string{"nodeplug.test/none=none"}
	if _, err := p.Run(ctxT(t), s); !errors.As(err, &ce) || ce.Stderr == "" {
		t.Fatalf("Run with an unknown CDI device = %v, want podman's error", err)
	}
	if list, err := p.List(ctxT(t), testLabel); err != nil || len(list) != 0 {
		t.Fatalf("List after a failed create = %+v, %v; want no container", list, err)
	}

	s.CDIDevices = nil
	if st := runToExit(t, p, s); st.ExitCode != 0 {
		t.Errorf("the container run again under the name: exit code %d", st.ExitCode)
	}
}

// A container listed running, stopped with SIGTERM, listed exited, then
// removed.
func TestListStopRemove(t *testing.T) {
	t.Parallel()
	p := newTestPodman(t)
	dir := t.TempDir()
	s := runSpec(dir, "sleeper")
	s.Args = []string{"sleep", "exit=7"}
	id, err := p.Run(ctxT(t), s)
	if err != nil {
		t.Fatal(err)
	}
	other := runSpec(dir, "other")
	other.Labels = map[string]string{"nodeplug.test/other": "x"}
	if _, err := p.Run(ctxT(t), other); err != nil {
		t.Fatal(err)
	}

	stopWhenSleeping(t, p, s, id)

	for i := range 2 {
		if err := p.Remove(ctxT(t), id); err != nil {
			t.Errorf("Remove #%d: %v", i+1, err)
		}
	}
	if list, err := p.List(ctxT(t), testLabel); err != nil || len(list) != 0 {
		t.Errorf("List after Remove = %+v, %v; want none", list, err)
	}
	if list, err := p.List(ctxT(t), "nodeplug.test/other"); err != nil || len(list) != 1 || list[0].Name != "other" {
		t.Errorf("List of the other label = %+v, %v; want the other container only", list, err)
	}
	if err := p.Stop(ctxT(t), id, time.Second); !errors.Is(err, ErrNotFound) {
		t.Errorf("Stop of a removed container = %v, want ErrNotFound", err)
	}
}

// Remove kills a running container.
func TestRemoveRunning(t *testing.T) {
	t.Parallel()
	p := newTestPodman(t)
	s := runSpec(t.TempDir(), "removed")
	s.Args = []string{"sleep"}
	id, err := p.Run(ctxT(t), s)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, p, s.Name, s.Name, "running", func(s State) bool { return s.Status == StatusRunning })
	if err := p.Remove(ctxT(t), id); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if list, err := p.List(ctxT(t), testLabel); err != nil || len(list) != 0 {
		t.Errorf("List after Remove = %+v, %v; want none", list, err)
	}
}

// stopWhenSleeping waits for the container id of s (running the probe
// with "sleep" and "exit=7") to run and say it waits for SIGTERM, stops
// it, and checks that it exited by itself (7) on SIGTERM, before the
// grace period, and that stopping it again is no error. It returns the
// exited state.
func stopWhenSleeping(t *testing.T, r Runtime, s Spec, id string) State {
	t.Helper()
	st := waitState(t, r, s.Name, s.Name, "running", func(s State) bool { return s.Status == StatusRunning })
	if st.ID != id || st.StartedAt.IsZero() || !st.FinishedAt.IsZero() {
		t.Errorf("running %+v, want ID %s, a start time and no finish time", st, id)
	}
	waitLog(t, s, "sleeping\n")
	if err := r.Stop(ctxT(t), id, 90*time.Second); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	st = waitState(t, r, s.Name, s.Name, "exited", exited)
	if st.ExitCode != 7 || st.FinishedAt.IsZero() {
		t.Errorf("stopped %+v, want exit code 7 and a finish time", st)
	}
	if got := logOf(t, s, ""); !strings.HasSuffix(got, "sleeping\ngot SIGTERM\n") {
		t.Errorf("log %q, want the program to have got SIGTERM", got)
	}
	if err := r.Stop(ctxT(t), id, time.Second); err != nil {
		t.Errorf("Stop of an exited container: %v", err)
	}
	return st
}

// waitLog waits for the container's log to hold want.
func waitLog(t *testing.T, s Spec, want string) {
	t.Helper()
	ctx := ctxT(t)
	for {
		if b, err := os.ReadFile(s.LogPath); err == nil {
			var out bytes.Buffer
			if podlogs.Copy(&out, bytes.NewReader(b), podlogs.Options{TailLines: -1}) == nil && strings.Contains(out.String(), want) {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the log of %s has no %q after %s", s.Name, want, deadline)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
