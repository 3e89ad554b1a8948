package containers

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestCreateArgs(t *testing.T) {
	p := &Podman{network: "none"}
	s := Spec{
		Name:        "k8s_app_web_default_uid_0",
		Labels:      map[string]string{"b": "2", "a": "1=x, y"},
		Image:       "registry.example/app:1",
		Command:     []string{"/bin/app", "<&>"},
		Args:        []string{"--", "-v"},
		WorkingDir:  "/work",
		Env:         []string{"A=1", "B=", "A=2"},
		CDIDevices:  []string{"vendor.example/gpu=0", "vendor.example/gpu=a,b"},
		Devices:     []Device{{HostPath: "/dev/fuse"}, {HostPath: "/dev/null", ContainerPath: "/dev/x", Permissions: "r"}},
		Mounts:      []Mount{{HostPath: "/h,1", ContainerPath: "/c", ReadOnly: true}, {HostPath: "/h2", ContainerPath: "/c2"}},
		Annotations: map[string]string{"note": `a,b "c"`},
		LogPath:     "/logs/app/0.log",
	}
	got, err := p.createArgs(s)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"create", "--pull=never", "--name=k8s_app_web_default_uid_0", "--network=none",
		"--label=a=1=x, y", "--label=b=2",
		`--annotation="note=a,b ""c"""`,
		"--log-driver=k8s-file", "--log-opt=path=/logs/app/0.log",
		"--device=vendor.example/gpu=0", `--device="vendor.example/gpu=a,b"`,
		"--device=/dev/fuse:/dev/fuse:rwm", "--device=/dev/null:/dev/x:r",
		"--volume=/h,1:/c:ro", "--volume=/h2:/c2",
		"--env=A=1", "--env=B=", "--env=A=2",
		"--workdir=/work",
		`--entrypoint=["/bin/app","<&>"]`,
		"--", "registry.example/app:1", "--", "-v",
	}
	if !slices.Equal(got, want) {
		t.Errorf("createArgs:\n got %q\nwant %q", got, want)
	}

	// Args only: no --entrypoint; nothing: the image alone.
	got, err = (&Podman{}).createArgs(Spec{Name: "n", Image: "i", Args: []string{"a"}})
	if want := []string{"create", "--pull=never", "--name=n", "--", "i", "a"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("createArgs with args only = %q, %v; want %q", got, err, want)
	}
}

func TestCreateArgsInvalid(t *testing.T) {
	ok := Spec{Name: "n", Image: "i"}
	for _, tc := range []struct {
		name string
		edit func(*Spec)
	}{
		{"no name", func(s *Spec) { s.Name = "" }},
		{"name like a flag", func(s *Spec) { s.Name = "--rm" }},
		{"no image", func(s *Spec) { s.Image = "" }},
		{"image like a flag", func(s *Spec) { s.Image = "-i" }},
		{"env without =", func(s *Spec) { s.Env = []string{"HOME"} }},
		{"env without key", func(s *Spec) { s.Env = []string{"=x"} }},
		{"label key with =", func(s *Spec) { s.Labels = map[string]string{"a=b": "c"} }},
		{"empty annotation key", func(s *Spec) { s.Annotations = map[string]string{"": "c"} }},
		{"relative log path", func(s *Spec) { s.LogPath = "logs/0.log" }},
		{"CDI name not qualified", func(s *Spec) { s.CDIDevices = []string{"gpu0"} }},
		{"relative device", func(s *Spec) { s.Devices = []Device{{HostPath: "dev/null"}} }},
		{"device with colon", func(s *Spec) { s.Devices = []Device{{HostPath: "/dev/a:b"}} }},
		{"device permissions", func(s *Spec) { s.Devices = []Device{{HostPath: "/dev/null", Permissions: "rwx"}} }},
		{"mount of a volume name", func(s *Spec) { s.Mounts = []Mount{{HostPath: "data", ContainerPath: "/data"}} }},
		{"mount without container path", func(s *Spec) { s.Mounts = []Mount{{HostPath: "/data"}} }},
		{"mount with colon", func(s *Spec) { s.Mounts = []Mount{{HostPath: "/a", ContainerPath: "/b:ro"}} }},
	} {
		s := ok
		tc.edit(&s)
		if args, err := (&Podman{}).createArgs(s); err == nil {
			t.Errorf("%s: createArgs = %q, want an error", tc.name, args)
		}
	}
}

// Output of podman 4.3.1's ps --all --format json (trimmed): an exited,
// a running and a created container.
const psOutput = `[
  {"AutoRemove": false, "Command": ["cmd1"], "CreatedAt": "1 second ago", "Exited": true,
   "ExitedAt": 1796578386, "ExitCode": 3,
   "Id": "07bbbf0182f227143cdd314c466b724b7327530878b9aca5ba78c039f3459c6b",
   "Image": "localhost/x:ep", "Labels": {"nodeplug.io/pod": "abc"}, "Mounts": [],
   "Names": ["lg"], "Namespaces": {}, "Networks": [], "Pid": 0, "Pod": "", "PodName": "",
   "Ports": null, "Size": null, "StartedAt": 1796578385, "State": "exited",
   "Status": "Exited (3) 1 second ago", "Created": 1796578386},
  {"Exited": false, "ExitedAt": -62135596800, "ExitCode": 0, "Id": "62d7", "Names": ["sl"],
   "Labels": {"nodeplug.io/pod": "abc"}, "StartedAt": 1796578398, "State": "running", "Status": "Up Less than a second ago"},
  {"Exited": false, "ExitedAt": -62135596800, "ExitCode": 0, "Id": "9c11", "Names": ["cr"],
   "Labels": null, "StartedAt": -62135596800, "State": "created", "Status": "Created"}
]
`

func TestParsePS(t *testing.T) {
	got, err := parsePS([]byte(psOutput))
	if err != nil {
		t.Fatal(err)
	}
	want := []State{
		{ID: "07bbbf0182f227143cdd314c466b724b7327530878b9aca5ba78c039f3459c6b", Name: "lg", Labels: map[string]string{"nodeplug.io/pod": "abc"},
			Status: StatusExited, ExitCode: 3, StartedAt: time.Unix(1796578385, 0), FinishedAt: time.Unix(1796578386, 0)},
		{ID: "62d7", Name: "sl", Labels: map[string]string{"nodeplug.io/pod": "abc"}, Status: StatusRunning, StartedAt: time.Unix(1796578398, 0)},
		{ID: "9c11", Name: "cr", Status: StatusCreated},
	}
	if len(got) != len(want) {
		t.Fatalf("parsePS = %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.ID != w.ID || g.Name != w.Name || g.Status != w.Status || g.ExitCode != w.ExitCode ||
			!g.StartedAt.Equal(w.StartedAt) || !g.FinishedAt.Equal(w.FinishedAt) || len(g.Labels) != len(w.Labels) {
			t.Errorf("container %d = %+v, want %+v", i, g, w)
		}
	}
	for _, out := range []string{"", "[]\n", " \n"} {
		if got, err := parsePS([]byte(out)); err != nil || len(got) != 0 {
			t.Errorf("parsePS(%q) = %+v, %v; want none", out, got, err)
		}
	}
	if _, err := parsePS([]byte("Error: something")); err == nil {
		t.Error("parsePS of text: no error")
	}
}

func TestPodmanStatus(t *testing.T) {
	for state, want := range map[string]Status{
		"created": StatusCreated, "configured": StatusCreated, "initialized": StatusCreated,
		"running": StatusRunning, "paused": StatusRunning, "stopping": StatusRunning,
		"exited": StatusExited, "stopped": StatusExited,
		"removing": StatusUnknown, "unknown": StatusUnknown, "": StatusUnknown,
	} {
		if got := podmanStatus(state); got != want {
			t.Errorf("podmanStatus(%q) = %s, want %s", state, got, want)
		}
	}
}

func TestEffectivePullPolicy(t *testing.T) {
	for _, tc := range []struct{ image, policy, want string }{
		{"nginx", "", PullAlways},
		{"nginx:latest", "", PullAlways},
		{"localhost:5000/nginx", "", PullAlways},
		{"localhost:5000/nginx:1.2", "", PullIfNotPresent},
		{"nginx@sha256:0123", "", PullIfNotPresent},
		{"nginx:1.2", PullAlways, PullAlways},
		{"nginx", PullNever, PullNever},
		{"nginx", PullIfNotPresent, PullIfNotPresent},
	} {
		if got, err := effectivePullPolicy(tc.image, tc.policy); err != nil || got != tc.want {
			t.Errorf("effectivePullPolicy(%s, %q) = %s, %v; want %s", tc.image, tc.policy, got, err, tc.want)
		}
	}
	if _, err := effectivePullPolicy("nginx", "always"); err == nil {
		t.Error("policy always (lower case): no error")
	}
}

func TestParseVersion(t *testing.T) {
	for out, want := range map[string]string{
		`{"Client":{"APIVersion":"4.3.1","Version":"4.3.1","GoVersion":"go1.19.8","OsArch":"linux/amd64"}}`: "4.3.1",
		`{"Client":{"Version":"5.0.0"},"Server":{"Version":"4.9.3"}}`:                                       "4.9.3",
	} {
		if got, err := parseVersion([]byte(out)); err != nil || got != want {
			t.Errorf("parseVersion(%s) = %q, %v; want %s", out, got, err, want)
		}
	}
	for _, out := range []string{"", "Version: 4.3.1", `{"Client":{}}`} {
		if got, err := parseVersion([]byte(out)); err == nil {
			t.Errorf("parseVersion(%q) = %q, want an error", out, got)
		}
	}
}

func TestCSVField(t *testing.T) {
	for in, want := range map[string]string{
		"path=/a/b":    "path=/a/b",
		"a=b,c":        `"a=b,c"`,
		`a="b"`:        `"a=""b"""`,
		" leading":     `" leading"`,
		"line\nbreaks": "\"line\nbreaks\"",
	} {
		if got := csvField(in); got != want {
			t.Errorf("csvField(%q) = %q, want %q", in, got, want)
		}
	}
	if got := csvField("x"); strings.Contains(got, "\n") {
		t.Errorf("csvField ends with a newline: %q", got)
	}
}
