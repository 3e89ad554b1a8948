package containers

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestDockerCreateArgs(t *testing.T) {
	d := &Docker{network: "none", engineCDI: true}
	s := Spec{
		Name:       "k8s_app_web_default_uid_0",
		Labels:     map[string]string{"b": "2", "a": "1=x, y"},
		Image:      "registry.example/app:1",
		Command:    []string{"/bin/app", "<&>"},
		Args:       []string{"--", "-v"},
		WorkingDir: "/work",
		Env:        []string{"A=1", "B=", "A=2"},
		CDIDevices: []string{"vendor.example/gpu=0", "vendor.example/gpu=1"},
		Devices:    []Device{{HostPath: "/dev/fuse"}, {HostPath: "/dev/null", ContainerPath: "/dev/x", Permissions: "r"}},
		Mounts:     []Mount{{HostPath: "/h,1", ContainerPath: "/c", ReadOnly: true}, {HostPath: "/h2", ContainerPath: "/c2"}},
		LogPath:    "/logs/app/0.log",
	}
	got, err := d.createArgs(s)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"create", "--pull=never", "--name=k8s_app_web_default_uid_0", "--network=none",
		"--log-driver=json-file",
		"--label=a=1=x, y", "--label=b=2", "--label=io.nodeplug.log-link=/logs/app/0.log",
		// The engine resolves the CDI names.
		"--device=vendor.example/gpu=0", "--device=vendor.example/gpu=1",
		"--device=/dev/fuse:/dev/fuse:rwm", "--device=/dev/null:/dev/x:r",
		`--mount=type=bind,"source=/h,1",target=/c,readonly`, "--mount=type=bind,source=/h2,target=/c2",
		"--env=A=1", "--env=B=", "--env=A=2",
		"--workdir=/work",
		"--entrypoint=/bin/app",
		"--", "registry.example/app:1", "<&>", "--", "-v",
	}
	if !slices.Equal(got, want) {
		t.Errorf("createArgs:\n got %q\nwant %q", got, want)
	}

	got, err = (&Docker{}).createArgs(Spec{Name: "n", Image: "i", Args: []string{"a"}})
	if want := []string{"create", "--pull=never", "--name=n", "--", "i", "a"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("createArgs with args only = %q, %v; want %q", got, err, want)
	}
	for name, s := range map[string]Spec{
		"bad CDI name":  {Name: "n", Image: "i", CDIDevices: []string{"gpu0"}},
		"empty command": {Name: "n", Image: "i", Command: []string{""}},
		"relative log":  {Name: "n", Image: "i", LogPath: "0.log"},
		"env":           {Name: "n", Image: "i", Env: []string{"A"}},
		"mount":         {Name: "n", Image: "i", Mounts: []Mount{{HostPath: "rel", ContainerPath: "/c"}}},
		"annotations":   {Name: "n", Image: "i", Annotations: map[string]string{"a": "b"}},
	} {
		if got, err := d.createArgs(s); err == nil {
			t.Errorf("%s: createArgs = %q, want an error", name, got)
		}
	}
}

// writeSpec writes a CDI spec file in dir.
func writeSpec(t *testing.T, dir, file string, spec map[string]any) {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, file), string(b))
}

// An engine without CDI: Docker resolves the names in its spec
// directories, read at each start, and gives the engine what they add.
func TestDockerCDIResolved(t *testing.T) {
	t.Parallel()
	d, dk := newTestDocker(t)
	d.engineCDI = false // as here (Docker 20.10), whatever the engine
	specDir, dir := t.TempDir(), t.TempDir()
	d.cdiDirs = []string{specDir}
	share := filepath.Join(dir, "share")
	if err := os.Mkdir(share, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(share, "file"), "from the spec's mount")

	s := dockerSpec(dk, dir, "cdi")
	s.CDIDevices = []string{"nodeplug.test/dev=one"}
	if _, err := d.Run(ctxT(t), s); err == nil || !strings.Contains(err.Error(), "unresolvable CDI devices nodeplug.test/dev=one") {
		t.Fatalf("Run before the spec is written = %v, want the device unresolvable", err)
	}

	writeSpec(t, specDir, "nodeplug.test-dev.json", map[string]any{
		"cdiVersion": "0.6.0", "kind": "nodeplug.test/dev",
		"containerEdits": map[string]any{"env": []string{"SPEC=1"}},
		"devices": []map[string]any{
			{"name": "one", "containerEdits": map[string]any{
				"env":         []string{"DEV=one"},
				"deviceNodes": []map[string]any{{"path": "/dev/nodeplug-cdi", "hostPath": "/dev/null", "permissions": "rw"}},
				"mounts":      []map[string]any{{"hostPath": share, "containerPath": "/cdi", "options": []string{"ro", "rbind", "nosuid"}}},
			}},
			{"name": "hooked", "containerEdits": map[string]any{
				"hooks": []map[string]any{{"hookName": "createContainer", "path": "/bin/true"}},
			}},
		},
	})
	s.Env = []string{"DEV=mine", "OWN=1"}
	s.Args = []string{"env", "stat=/dev/nodeplug-cdi", "cat=/cdi/file", "write=/cdi/new"}
	if st := runDockerToExit(t, d, s); st.ExitCode != 0 {
		t.Fatalf("exit code %d\n%s", st.ExitCode, logOf(t, s, ""))
	}
	stdout := logOf(t, s, "stdout")
	for _, want := range []string{
		"stat /dev/nodeplug-cdi=char device\n",
		"cat /cdi/file=from the spec's mount\n",
		"write /cdi/new=error: open /cdi/new: read-only file system\n",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout %q, want %q", stdout, want)
		}
	}
	var env []string
	for _, line := range strings.Split(stdout, "\n") {
		if v, ok := strings.CutPrefix(line, "env="); ok {
			if err := json.Unmarshal([]byte(v), &env); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The spec's variables win over the container's own, as when a
	// runtime applies the spec.
	for _, want := range []string{"SPEC=1", "DEV=one", "OWN=1"} {
		if !slices.Contains(env, want) {
			t.Errorf("env %q, want %s", env, want)
		}
	}
	if slices.Contains(env, "DEV=mine") {
		t.Errorf("env %q: the spec's DEV wins", env)
	}

	s2 := dockerSpec(dk, dir, "hooked")
	s2.CDIDevices = []string{"nodeplug.test/dev=hooked"}
	if _, err := d.Run(ctxT(t), s2); err == nil || !strings.Contains(err.Error(), "OCI hooks") {
		t.Errorf("Run with a device with hooks = %v, want it refused", err)
	}
	if list := mine(t, d, dk); len(list) != 1 {
		t.Errorf("the test's containers: %+v, want the first only", list)
	}
}

// TestDockerStateTimes: a container that ended at once may carry an exit
// stamped before its start (the engine stamps them from two sources): it
// is read as finished when it started; a container not exited has no
// finish time (docker keeps that of the start before).
func TestDockerStateTimes(t *testing.T) {
	var c dockerContainer
	c.State.Status, c.State.ExitCode = "exited", 3
	c.State.StartedAt, c.State.FinishedAt = "2026-12-06T21:36:01.606374575Z", "2026-12-06T21:36:01.605864604Z"
	if st := c.state(); st.ExitCode != 3 || !st.FinishedAt.Equal(st.StartedAt) || st.StartedAt.Nanosecond() != 606374575 {
		t.Errorf("exited: %+v, want exit 3, finished when it started", st)
	}
	c.State.FinishedAt = "2026-12-06T21:36:02Z"
	if st := c.state(); st.FinishedAt.Sub(st.StartedAt) <= 0 {
		t.Errorf("exited later: %+v, want its own finish time", st)
	}
	c.State.Status = "running"
	if st := c.state(); !st.FinishedAt.IsZero() || st.Status != StatusRunning {
		t.Errorf("running: %+v, want no finish time", st)
	}
}
