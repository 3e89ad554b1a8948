package cdispec

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

func newSpecs(t *testing.T) (*Specs, string, string) {
	t.Helper()
	root := t.TempDir()
	dir, other := filepath.Join(root, "run"), filepath.Join(root, "etc")
	s, err := New(Config{Dir: dir, SearchDirs: []string{other}})
	if err != nil {
		t.Fatal(err)
	}
	return s, dir, other
}

func TestDeviceName(t *testing.T) {
	for _, tc := range []struct {
		uid, container string
		plain          bool
	}{
		{"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "main", true},
		{"pod", "c", true},
		{"pod_1", "c", false}, // an underscore would make two names meet
		{"pod", "c_1", false}, // likewise
		{"pod/1", "c", false}, // not a CDI name character
		{"-pod", "c", false},  // must start with a letter or digit
		{"pod", "c.", false},  // must end with one
		{strings.Repeat("a", 250), "c", false},
	} {
		n := DeviceName(tc.uid, tc.container)
		if err := parser.ValidateDeviceName(n); err != nil {
			t.Errorf("%q %q: %q is not a CDI device name: %v", tc.uid, tc.container, n, err)
		}
		if plain := n == tc.uid+"_"+tc.container; plain != tc.plain {
			t.Errorf("%q %q: name %q, plain %v want %v", tc.uid, tc.container, n, plain, tc.plain)
		}
	}
	if DeviceName("a_b", "c") == DeviceName("a", "b_c") {
		t.Fatal("two containers share a name")
	}
	if got := QualifiedName("pod", "c"); got != "nodeplug.io/container=pod_c" {
		t.Fatalf("qualified name %q", got)
	}
}

// A spec written is read by CDI's own cache as a runtime reads it; empty
// edits make no device and remove an older spec.
func TestWriteRemoveResolve(t *testing.T) {
	s, dir, other := newSpecs(t)
	e := Edits{
		Envs:    map[string]string{"B": "2", "A": "1"},
		Mounts:  []Mount{{ContainerPath: "/data", HostPath: "/tmp", ReadOnly: true}},
		Devices: []DeviceNode{{ContainerPath: "/dev/x", HostPath: "/dev/null", Permissions: "rw"}},
	}
	name, err := s.Write("pod", "c", e)
	if err != nil || name != "nodeplug.io/container=pod_c" {
		t.Fatalf("write: %q, %v", name, err)
	}
	c, _ := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	d := c.GetDevice(name)
	if d == nil {
		t.Fatalf("not resolved by CDI: %v", c.GetErrors())
	}
	if !slices.Equal(d.ContainerEdits.Env, []string{"A=1", "B=2"}) || d.ContainerEdits.Mounts[0].Options[1] != "ro" ||
		d.ContainerEdits.DeviceNodes[0].HostPath != "/dev/null" {
		t.Fatalf("edits %+v", d.ContainerEdits)
	}
	if err := s.Resolve([]string{name}); err != nil {
		t.Fatal(err)
	}
	err = s.Resolve([]string{name, "vendor.com/gpu=0", "vendor.com/gpu=1"})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) ||
		!strings.Contains(err.Error(), `CDI devices "vendor.com/gpu=0", "vendor.com/gpu=1" do not resolve in the CDI spec directories `+other+", "+dir) {
		t.Fatalf("err = %v", err)
	}
	// A broken spec file of the vendor is named in the error.
	if err := os.MkdirAll(other, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(other, "vendor.com-gpu.yaml"), []byte("cdiVersion: 0.3.0\nkind: vendor.com/gpu\ndevices: [{name: '0'}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Resolve([]string{"vendor.com/gpu=0"}); err == nil || !strings.Contains(err.Error(), "vendor.com-gpu.yaml") {
		t.Fatalf("err = %v, want the broken spec named", err)
	}
	if name, err := s.Write("pod", "c", Edits{Annotations: map[string]string{"a": "b"}}); err != nil || name != "" {
		t.Fatalf("empty edits: %q, %v", name, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "nodeplug.io-container_pod_c.json")); !os.IsNotExist(err) {
		t.Fatalf("spec left for empty edits: %v", err)
	}
	if err := s.Remove("pod", "c"); err != nil {
		t.Fatalf("removing what is gone: %v", err)
	}
}

// Edits CDI refuses are the plugin's fault: FailedPrecondition, and no
// file is left behind.
func TestWriteRefusesInvalidEdits(t *testing.T) {
	s, dir, _ := newSpecs(t)
	for name, e := range map[string]Edits{
		"env without name":   {Envs: map[string]string{"": "x"}},
		"mount without path": {Mounts: []Mount{{ContainerPath: "/x"}}},
		"bad permissions":    {Devices: []DeviceNode{{ContainerPath: "/dev/x", HostPath: "/dev/null", Permissions: "rwz"}}},
	} {
		if _, err := s.Write("pod", "c", e); !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("files left: %v", entries)
	}
}

func TestSync(t *testing.T) {
	s, dir, _ := newSpecs(t)
	env := Edits{Envs: map[string]string{"A": "1"}}
	for _, c := range []string{"old", "keep"} {
		if _, err := s.Write("pod", c, env); err != nil {
			t.Fatal(err)
		}
	}
	foreign := filepath.Join(dir, "vendor.com-gpu.json")
	if err := os.WriteFile(foreign, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Sync([]Container{{PodUID: "pod", Container: "keep", Edits: env}, {PodUID: "pod", Container: "new", Edits: env}, {PodUID: "pod", Container: "none"}}); err != nil {
		t.Fatal(err)
	}
	var names []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{"nodeplug.io-container_pod_keep.json", "nodeplug.io-container_pod_new.json", "vendor.com-gpu.json"}
	if !slices.Equal(names, want) {
		t.Fatalf("files %v, want %v", names, want)
	}
}

func TestNewRefusesRelativeDirs(t *testing.T) {
	if _, err := New(Config{Dir: "cdi"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("relative dir: %v", err)
	}
	if _, err := New(Config{Dir: t.TempDir(), SearchDirs: []string{"etc/cdi"}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("relative search dir: %v", err)
	}
}

// Merge keeps the first value, as the kubelet does, and names each
// conflict; CDI devices pass by name, once each.
func TestMerge(t *testing.T) {
	a := &pluginapi.ContainerAllocateResponse{
		Envs:        map[string]string{"X": "a", "Y": "a"},
		Mounts:      []*pluginapi.Mount{{ContainerPath: "/m", HostPath: "/a"}},
		Devices:     []*pluginapi.DeviceSpec{{ContainerPath: "/dev/d", HostPath: "/dev/a"}},
		Annotations: map[string]string{"k": "a"},
		CdiDevices:  []*pluginapi.CDIDevice{{Name: "v.com/c=1"}},
	}
	b := &pluginapi.ContainerAllocateResponse{
		Envs:       map[string]string{"X": "b", "Y": "a", "Z": "b"},
		Mounts:     []*pluginapi.Mount{{ContainerPath: "/m", HostPath: "/b"}, {ContainerPath: "/n", HostPath: "/b"}},
		Devices:    []*pluginapi.DeviceSpec{{ContainerPath: "/dev/d", HostPath: "/dev/a"}},
		CdiDevices: []*pluginapi.CDIDevice{{Name: "v.com/c=1"}, {Name: "v.com/c=2"}},
	}
	e, conflicts := Merge([]*pluginapi.ContainerAllocateResponse{a, nil, b})
	if e.Envs["X"] != "a" || e.Envs["Z"] != "b" || len(e.Mounts) != 2 || e.Mounts[0].HostPath != "/a" || len(e.Devices) != 1 || e.Annotations["k"] != "a" {
		t.Fatalf("merged %+v", e)
	}
	if len(conflicts) != 2 || !strings.Contains(conflicts[0], `environment variable X="b"`) || !strings.Contains(conflicts[1], `mount at "/m"`) {
		t.Fatalf("conflicts %q", conflicts)
	}
	if got := CDIDevices([]*pluginapi.ContainerAllocateResponse{a, b}); !slices.Equal(got, []string{"v.com/c=1", "v.com/c=2"}) {
		t.Fatalf("CDI devices %v", got)
	}
}
