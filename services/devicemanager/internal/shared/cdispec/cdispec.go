// Package cdispec keeps the CDI (Container Device Interface) specs of the
// containers that device plugins gave devices to, and resolves CDI device
// names the way container runtimes do.
//
// Device plugins mostly answer Allocate with environment variables, mounts
// and device nodes, which a kubelet hands to its runtime through CRI. A
// runtime started without a kubelet (podman, Docker, containerd, CRI-O)
// takes devices by CDI name instead: it looks the name up in the spec files
// of its spec directories (/etc/cdi and /var/run/cdi by default) and
// applies the container edits the spec gives. So for each allocated
// container nodeplug writes one spec holding one device,
// nodeplug.io/container=NAME (see DeviceName), whose edits are the
// container's device-plugin edits merged (see Merge). The specs are made,
// validated, written (atomically: a temporary file renamed) and read with
// tags.cncf.io/container-device-interface, the library the runtimes use.
package cdispec

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispecs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

const (
	// Vendor and Class make the kind of nodeplug's CDI devices.
	Vendor = "nodeplug.io"
	Class  = "container"
	// Kind is the kind of nodeplug's CDI devices: nodeplug.io/container.
	Kind = Vendor + "/" + Class
	// DefaultDir is where the specs are written by default: the directory
	// CDI reserves for specs generated at run time.
	DefaultDir = cdi.DefaultDynamicDir
	// specPrefix starts the file name of every spec written here
	// (cdi.GenerateTransientSpecName).
	specPrefix = Vendor + "-" + Class + "_"
	specExt    = ".json"
	// maxPlainName bounds a device name made of the pod UID and container
	// name as given; a longer one is a hash, so that the spec's file name
	// stays within a file system's 255 bytes.
	maxPlainName = 200
)

// DefaultSearchDirs are the spec directories CDI names are resolved in by
// default, as the runtimes search them.
func DefaultSearchDirs() []string { return slices.Clone(cdi.DefaultSpecDirs) }

// Config configures Specs.
type Config struct {
	// Dir is where the specs are written; created when absent. Default
	// DefaultDir.
	Dir string
	// SearchDirs are where CDI names are resolved, in CDI's priority order
	// (a later directory's spec wins a conflict); Dir is searched last when
	// it is not among them. Default DefaultSearchDirs.
	SearchDirs []string
	Log        *slog.Logger
}

// Specs writes, removes and resolves CDI specs. Its methods are safe for
// concurrent use; the spec of one container is written by one call at a
// time.
type Specs struct {
	dir  string
	dirs []string
	log  *slog.Logger

	mu     sync.Mutex // serialises writes, removals and resolutions
	writer *cdi.Cache // Dir alone: where WriteSpec and RemoveSpec act
	// files are the spec files last read by Resolve (resolve.go), by path.
	files map[string]*readSpec
}

// New returns Specs for cfg, creating its Dir.
func New(cfg Config) (*Specs, error) {
	if cfg.Dir == "" {
		cfg.Dir = DefaultDir
	}
	if cfg.SearchDirs == nil {
		cfg.SearchDirs = DefaultSearchDirs()
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	dir := filepath.Clean(cfg.Dir)
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("CDI spec directory %q is not absolute: %w", cfg.Dir, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("CDI spec directory: %w", err)
	}
	var dirs []string
	for _, d := range cfg.SearchDirs {
		d = filepath.Clean(d)
		if !filepath.IsAbs(d) {
			return nil, fmt.Errorf("CDI spec search directory %q is not absolute: %w", d, errdefs.ErrInvalidArgument)
		}
		if !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	if !slices.Contains(dirs, dir) {
		dirs = append(dirs, dir)
	}
	// The writer writes and removes only: it never resolves, so it need
	// not follow the directory (its first scan's errors do not matter).
	writer, _ := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	return &Specs{dir: dir, dirs: dirs, log: cfg.Log, writer: writer, files: map[string]*readSpec{}}, nil
}

// Dir returns where the specs are written.
func (s *Specs) Dir() string { return s.dir }

// SearchDirs returns where CDI names are resolved, in priority order.
func (s *Specs) SearchDirs() []string { return slices.Clone(s.dirs) }

// DeviceName returns the CDI device name of a container of a pod: the pod
// UID and the container name joined by an underscore when both are made of
// the characters a CDI device name allows (letters, digits, '-', '.', ':';
// starting and ending with a letter or digit) and are short enough, else
// "h" and 40 hex digits of their SHA-256. The two forms never meet (a hash
// has no underscore), so distinct containers have distinct names.
func DeviceName(podUID, container string) string {
	plain := podUID + "_" + container
	if len(plain) <= maxPlainName && plainPart(podUID) && plainPart(container) {
		return plain
	}
	sum := sha256.Sum256([]byte(podUID + "\x00" + container))
	return "h" + hex.EncodeToString(sum[:])[:40]
}

// plainPart reports whether s can stand in a device name as it is.
func plainPart(s string) bool {
	if s == "" || strings.ContainsRune(s, '_') {
		return false
	}
	return parser.ValidateDeviceName(s) == nil
}

// QualifiedName returns the fully qualified CDI name of a container's
// device: nodeplug.io/container=DeviceName.
func QualifiedName(podUID, container string) string {
	return parser.QualifiedName(Vendor, Class, DeviceName(podUID, container))
}

// specName is the file name (without extension) of a container's spec.
func specName(device string) string {
	return cdi.GenerateTransientSpecName(Vendor, Class, device)
}

// Write writes the spec of a container with edits e, replacing an older
// one, and returns the qualified name of its device. Edits with no
// environment variable, mount or device node make no device: Write removes
// the container's spec and returns "". An edit CDI refuses (an environment
// variable without a name, a mount or device node without a path, bad
// device permissions) is errdefs.ErrFailedPrecondition naming it.
func (s *Specs) Write(podUID, container string, e Edits) (string, error) {
	name := DeviceName(podUID, container)
	raw := e.spec(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if raw == nil {
		return "", s.removeLocked(name)
	}
	if err := s.writer.WriteSpec(raw, specName(name)+specExt); err != nil {
		if errors.Is(err, os.ErrPermission) || errors.Is(err, os.ErrNotExist) || isIOError(err) {
			return "", fmt.Errorf("CDI spec of pod %s container %s: %v: %w", podUID, container, err, errdefs.ErrInternal)
		}
		return "", fmt.Errorf("the device plugins' edits for pod %s container %s are not a valid CDI device: %v: %w",
			podUID, container, err, errdefs.ErrFailedPrecondition)
	}
	return parser.QualifiedName(Vendor, Class, name), nil
}

// isIOError reports whether err came from the file system rather than
// from CDI's validation of the spec.
func isIOError(err error) bool {
	var pe *os.PathError
	var le *os.LinkError
	return errors.As(err, &pe) || errors.As(err, &le)
}

// Remove removes the spec of a container; a spec that is not there is
// success.
func (s *Specs) Remove(podUID, container string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(DeviceName(podUID, container))
}

func (s *Specs) removeLocked(device string) error {
	if err := s.writer.RemoveSpec(specName(device) + specExt); err != nil {
		return fmt.Errorf("remove CDI spec %s: %v: %w", specName(device), err, errdefs.ErrInternal)
	}
	return nil
}

// Container is a container's device-plugin edits, for Sync.
type Container struct {
	PodUID    string
	Container string
	Edits     Edits
}

// Sync makes Dir hold the specs of exactly the containers given, as at a
// start from the checkpoint: it writes every spec (a missing one comes
// back; one that differs is replaced) and removes the spec files of
// nodeplug's kind that belong to no container given. It goes on past a
// failure and returns them all.
func (s *Specs) Sync(containers []Container) error {
	want := map[string]bool{}
	var errs []error
	for _, c := range containers {
		name, err := s.Write(c.PodUID, c.Container, c.Edits)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if name != "" {
			want[specName(DeviceName(c.PodUID, c.Container))+specExt] = true
		}
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("read CDI spec directory: %w", err))...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ent := range entries {
		n := ent.Name()
		if !strings.HasPrefix(n, specPrefix) || !strings.HasSuffix(n, specExt) || want[n] || ent.IsDir() {
			continue
		}
		if err := os.Remove(filepath.Join(s.dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove stale CDI spec %s: %w", n, err))
			continue
		}
		s.log.Info("stale CDI spec removed", "file", filepath.Join(s.dir, n))
	}
	return errors.Join(errs...)
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// Edits are a container's device-plugin edits, as Merge makes them.
type Edits struct {
	Envs        map[string]string
	Mounts      []Mount
	Devices     []DeviceNode
	Annotations map[string]string
}

// Mount is a bind mount of a host path.
type Mount struct {
	ContainerPath string
	HostPath      string
	ReadOnly      bool
}

// DeviceNode is a host device node made available in the container.
type DeviceNode struct {
	ContainerPath string
	HostPath      string
	Permissions   string
}

// Empty reports whether e has nothing a CDI device can carry (annotations
// are not container edits in CDI).
func (e Edits) Empty() bool { return len(e.Envs) == 0 && len(e.Mounts) == 0 && len(e.Devices) == 0 }

// spec returns the CDI spec of a device named name with e's edits, or nil
// when e is Empty. Its content depends on e alone (environment variables in
// name order), so that writing it again writes the same bytes.
func (e Edits) spec(name string) *cdispecs.Spec {
	if e.Empty() {
		return nil
	}
	var edits cdispecs.ContainerEdits
	for _, k := range slices.Sorted(maps.Keys(e.Envs)) {
		edits.Env = append(edits.Env, k+"="+e.Envs[k])
	}
	for _, m := range e.Mounts {
		opts := []string{"rbind", "rw"}
		if m.ReadOnly {
			opts = []string{"rbind", "ro"}
		}
		edits.Mounts = append(edits.Mounts, &cdispecs.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Type: "bind", Options: opts})
	}
	for _, d := range e.Devices {
		edits.DeviceNodes = append(edits.DeviceNodes, &cdispecs.DeviceNode{Path: d.ContainerPath, HostPath: d.HostPath, Permissions: d.Permissions})
	}
	raw := &cdispecs.Spec{
		Kind:    Kind,
		Devices: []cdispecs.Device{{Name: name, ContainerEdits: edits}},
	}
	// The oldest CDI version that holds these edits, so that older
	// runtimes read the spec too.
	if v, err := cdispecs.MinimumRequiredVersion(raw); err == nil {
		raw.Version = v
	} else {
		raw.Version = cdispecs.CurrentVersion
	}
	return raw
}
