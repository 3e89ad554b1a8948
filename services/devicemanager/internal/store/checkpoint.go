// This file is the checkpoint's format: a versioned JSON document whose data
// is protected by a SHA-256 checksum, written atomically (temporary file in
// the same directory, fsync, rename, fsync of the directory).

package store

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// FileName is the checkpoint's name in the device-plugins directory.
const FileName = "nodeplug_checkpoint"

// Version is the format version written.
const Version = 1

// ErrCorrupt marks saved state that cannot be trusted: not JSON, truncated,
// another format or version, or a checksum mismatch.
var ErrCorrupt = errors.New("checkpoint is corrupt")

// Data is what the checkpoint holds.
type Data struct {
	Resources   []Resource   `json:"resources"`
	Allocations []Allocation `json:"allocations"`
}

// Resource is one resource's device set and endpoints.
type Resource struct {
	Name      string     `json:"name"`
	Devices   []Device   `json:"devices"`
	Endpoints []Endpoint `json:"endpoints"`
}

// Device is one device and its health.
type Device struct {
	ID      string `json:"id"`
	Healthy bool   `json:"healthy"`
	// Topology holds NUMA node IDs, if the plugin reported any.
	NUMANodes []int64 `json:"numa_nodes,omitempty"`
}

// Endpoint is one device plugin endpoint.
type Endpoint struct {
	Endpoint         string    `json:"endpoint"`
	SocketPath       string    `json:"socket_path"`
	Generation       string    `json:"generation"`
	RegistrationPath string    `json:"registration_path"`
	Versions         []string  `json:"versions,omitempty"`
	PreStartRequired bool      `json:"pre_start_required"`
	Preferred        bool      `json:"get_preferred_allocation_available"`
	Registered       time.Time `json:"registered"`
	Primary          bool      `json:"primary"`
}

// Allocation is one container's devices of one resource.
type Allocation struct {
	PodUID string `json:"pod_uid"`
	// PodNamespace and PodName name the pod when its first Allocate did;
	// checkpoints written before they existed have neither.
	PodNamespace  string   `json:"pod_namespace,omitempty"`
	PodName       string   `json:"pod_name,omitempty"`
	ContainerName string   `json:"container_name"`
	ResourceName  string   `json:"resource_name"`
	DeviceIDs     []string `json:"device_ids"`
	// Response is the plugin's ContainerAllocateResponse in protobuf wire
	// format (base64 in JSON).
	Response  []byte    `json:"response"`
	TraceID   string    `json:"trace_id,omitempty"`
	Allocated time.Time `json:"allocated"`
}

type envelope struct {
	Version  int             `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// Path returns the checkpoint path in dir.
func Path(dir string) string { return filepath.Join(dir, FileName) }

func checksum(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// marshal encodes d with its envelope.
func marshal(d *Data) ([]byte, error) {
	resources := make([][]byte, len(d.Resources))
	for i := range d.Resources {
		b, err := json.Marshal(&d.Resources[i])
		if err != nil {
			return nil, err
		}
		resources[i] = b
	}
	allocations := make([][]byte, len(d.Allocations))
	for i := range d.Allocations {
		b, err := json.Marshal(&d.Allocations[i])
		if err != nil {
			return nil, err
		}
		allocations[i] = b
	}
	return marshalParts(resources, allocations), nil
}

// marshalParts encodes a checkpoint from the JSON encodings of its resources
// and allocations (each json.Marshal of a Resource or an Allocation), so a
// caller can keep the encoding of what did not change. The result is the
// same as marshal's. The envelope is written by hand: encoding/json would
// validate and copy the data again.
func marshalParts(resources, allocations [][]byte) []byte {
	n := 64
	for _, b := range resources {
		n += len(b) + 1
	}
	for _, b := range allocations {
		n += len(b) + 1
	}
	data := make([]byte, 0, n)
	data = append(data, `{"resources":[`...)
	data = appendJoined(data, resources)
	data = append(data, `],"allocations":[`...)
	data = appendJoined(data, allocations)
	data = append(data, "]}"...)
	sum := checksum(data)
	out := make([]byte, 0, len(data)+len(sum)+48)
	out = fmt.Appendf(out, `{"version":%d,"checksum":%q,"data":`, Version, sum)
	out = append(out, data...)
	return append(out, '}')
}

func appendJoined(dst []byte, parts [][]byte) []byte {
	for i, b := range parts {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, b...)
	}
	return dst
}

// unmarshal decodes and verifies a checkpoint. Errors wrap ErrCorrupt.
func unmarshal(b []byte) (*Data, error) {
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the checkpoint", ErrCorrupt)
	}
	if env.Version != Version {
		return nil, fmt.Errorf("%w: version %d, want %d", ErrCorrupt, env.Version, Version)
	}
	if len(env.Data) == 0 {
		return nil, fmt.Errorf("%w: no data", ErrCorrupt)
	}
	if got := checksum(env.Data); got != env.Checksum {
		return nil, fmt.Errorf("%w: checksum %s, computed %s", ErrCorrupt, env.Checksum, got)
	}
	var d Data
	if err := json.Unmarshal(env.Data, &d); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	return &d, nil
}

// ReadFile reads the checkpoint at path. A missing file returns (nil, nil).
// A corrupt file returns an error wrapping ErrCorrupt, and so does anything
// at path that is not a regular file: the checkpoint is opened without
// following symlinks (a link planted there is never read through), and
// without blocking on a FIFO.
func ReadFile(path string) (*Data, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case errors.Is(err, syscall.ELOOP):
		return nil, fmt.Errorf("%w: %s is a symbolic link, not followed", ErrCorrupt, path)
	case err != nil:
		return nil, fmt.Errorf("%w: open %s: %v", ErrCorrupt, path, err)
	}
	defer func() { _ = f.Close() }()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: stat %s: %v", ErrCorrupt, path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%w: %s is not a regular file (%s)", ErrCorrupt, path, fi.Mode().Type())
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %v", ErrCorrupt, path, err)
	}
	return unmarshal(b)
}

// moveAside renames a corrupt checkpoint to <path>.corrupt-<timestamp> and
// returns the new name.
func moveAside(path string, now time.Time) (string, error) {
	aside := fmt.Sprintf("%s.corrupt-%s", path, now.UTC().Format("20060102T150405.000000000Z"))
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	return aside, syncDir(filepath.Dir(path))
}

// save writes d to path atomically: a temporary file in the same directory,
// fsync, rename over path, fsync of the directory.
func save(path string, d *Data) error {
	b, err := marshal(d)
	if err != nil {
		return err
	}
	return writeFile(path, b)
}

// writeFile writes an encoded checkpoint atomically: a temporary file in the
// same directory, fsync, rename over path, fsync of the directory. The
// temporary file is created new (O_EXCL) without following symlinks, and
// the rename replaces whatever is at path (a symlink included) rather than
// writing through it.
func writeFile(path string, b []byte) error {
	dir := filepath.Dir(path)
	f, err := createTemp(dir, "."+FileName+".tmp-")
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if tmp != "" {
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(b); err != nil {
		_ = f.Close()
		return fmt.Errorf("write checkpoint %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return fmt.Errorf("fsync checkpoint %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close checkpoint %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename checkpoint into place: %w", err)
	}
	tmp = ""
	return syncDir(dir)
}

// createTemp creates a new file dir/<prefix><random>, mode 0600, opened for
// writing with O_EXCL and O_NOFOLLOW: it never opens an existing file or
// follows a link planted at its name.
func createTemp(dir, prefix string) (*os.File, error) {
	for range 100 {
		var rnd [8]byte
		if _, err := rand.Read(rnd[:]); err != nil {
			return nil, err
		}
		name := filepath.Join(dir, prefix+hex.EncodeToString(rnd[:]))
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		// The mode is exactly 0600, whatever the umask.
		if err := f.Chmod(0o600); err != nil {
			_ = f.Close()
			_ = os.Remove(name)
			return nil, err
		}
		return f, nil
	}
	return nil, fmt.Errorf("create a temporary file in %s: too many name collisions", dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}
