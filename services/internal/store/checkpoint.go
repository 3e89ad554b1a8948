// This file is the snapshot's format: a versioned JSON document whose data
// is protected by a SHA-256 checksum, written atomically (temporary file in
// the same directory, fsync, rename, fsync of the directory). Version 2
// names the journal that continues it; version 1, the whole-state
// checkpoint of earlier releases, is read and migrated.

package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/services/internal/atomicfile"
)

// FileName is the snapshot's name in the device-plugins directory
// (pkg/layout, which names every file under the root dir).
const FileName = layout.CheckpointFileName

// Version is the snapshot format version written. Version 1 (no journal)
// is still read.
const Version = 2

// ErrCorrupt marks saved state that cannot be trusted: not JSON, truncated,
// another format or version, a checksum mismatch, or not a regular file.
var ErrCorrupt = errors.New("checkpoint is corrupt")

// Data is the saved state.
type Data struct {
	Resources   []Resource   `json:"resources"`
	Allocations []Allocation `json:"allocations"`
	// Claims are the prepared DRA claims (claims.go); files written
	// before them have none.
	Claims []Claim `json:"claims,omitempty"`
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
	// ContainerKind is the container's part in its pod: "init" or
	// "sidecar"; empty for an app container (and in checkpoints written
	// before it existed). An init container's devices may be held by
	// other allocations of its pod too.
	ContainerKind string `json:"container_kind,omitempty"`
}

type envelope struct {
	Version  int             `json:"version"`
	Checksum string          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// Path returns the snapshot's path in dir.
func Path(dir string) string { return filepath.Join(dir, FileName) }

func checksum(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// state is the saved state as records kept in their JSON encoding, so
// that a snapshot re-encodes nothing.
type state struct {
	resources   map[string][]byte
	allocations map[AllocationKey][]byte
	claims      map[string][]byte // by claim UID
}

func newState() *state {
	return &state{resources: map[string][]byte{}, allocations: map[AllocationKey][]byte{}, claims: map[string][]byte{}}
}

func (s *state) clone() *state {
	return &state{resources: maps.Clone(s.resources), allocations: maps.Clone(s.allocations), claims: maps.Clone(s.claims)}
}

func (s *state) empty() bool { return len(s.resources)+len(s.allocations)+len(s.claims) == 0 }

// putResource records the encoding of a resource, found by its name.
func (s *state) putResource(raw []byte) error {
	var r struct {
		Name *string `json:"name"`
	}
	if err := json.Unmarshal(raw, &r); err != nil || r.Name == nil {
		return fmt.Errorf("%w: a resource record without a name: %v", ErrCorrupt, err)
	}
	s.resources[*r.Name] = raw
	return nil
}

// putAllocation records the encoding of an allocation, found by its key.
func (s *state) putAllocation(raw []byte) error {
	var k AllocationKey
	if err := json.Unmarshal(raw, &k); err != nil || k.PodUID == "" {
		return fmt.Errorf("%w: an allocation record without a pod UID: %v", ErrCorrupt, err)
	}
	s.allocations[k] = raw
	return nil
}

// data decodes every record, sorted by name and key.
func (s *state) data() (*Data, error) {
	d := &Data{Resources: make([]Resource, 0, len(s.resources)), Allocations: make([]Allocation, 0, len(s.allocations))}
	for _, name := range slices.Sorted(maps.Keys(s.resources)) {
		var r Resource
		if err := json.Unmarshal(s.resources[name], &r); err != nil {
			return nil, fmt.Errorf("%w: resource %s: %v", ErrCorrupt, name, err)
		}
		d.Resources = append(d.Resources, r)
	}
	for _, k := range slices.SortedFunc(maps.Keys(s.allocations), AllocationKey.compare) {
		var a Allocation
		if err := json.Unmarshal(s.allocations[k], &a); err != nil {
			return nil, fmt.Errorf("%w: allocation %v: %v", ErrCorrupt, k, err)
		}
		d.Allocations = append(d.Allocations, a)
	}
	claims, err := s.claimsData()
	if err != nil {
		return nil, err
	}
	if len(claims) > 0 {
		d.Claims = claims
	}
	return d, nil
}

// stateOf encodes d.
func stateOf(d *Data) (*state, error) {
	s := newState()
	for i := range d.Resources {
		b, err := json.Marshal(&d.Resources[i])
		if err != nil {
			return nil, err
		}
		s.resources[d.Resources[i].Name] = b
	}
	for i := range d.Allocations {
		b, err := json.Marshal(&d.Allocations[i])
		if err != nil {
			return nil, err
		}
		s.allocations[d.Allocations[i].Key()] = b
	}
	for i := range d.Claims {
		b, err := json.Marshal(&d.Claims[i])
		if err != nil {
			return nil, err
		}
		s.claims[d.Claims[i].UID] = b
	}
	return s, nil
}

// snapshot is a decoded snapshot file.
type snapshot struct {
	version int
	// journal is the number of the first journal whose changes are not
	// in this snapshot (0 for version 1, which has no journal).
	journal uint64
	state   *state
}

// marshalSnapshot encodes s as a snapshot continued by journal number
// journal, records sorted. The envelope is written by hand: encoding/json
// would validate and copy the data again.
func marshalSnapshot(journal uint64, s *state) []byte {
	n := 96
	for _, b := range s.resources {
		n += len(b) + 1
	}
	for _, b := range s.allocations {
		n += len(b) + 1
	}
	for _, b := range s.claims {
		n += len(b) + 1
	}
	data := make([]byte, 0, n)
	data = fmt.Appendf(data, `{"journal":%d,"resources":[`, journal)
	for i, name := range slices.Sorted(maps.Keys(s.resources)) {
		if i > 0 {
			data = append(data, ',')
		}
		data = append(data, s.resources[name]...)
	}
	data = append(data, `],"allocations":[`...)
	for i, k := range slices.SortedFunc(maps.Keys(s.allocations), AllocationKey.compare) {
		if i > 0 {
			data = append(data, ',')
		}
		data = append(data, s.allocations[k]...)
	}
	data = append(data, ']')
	data = appendSnapshotClaims(data, s)
	data = append(data, '}')
	sum := checksum(data)
	out := make([]byte, 0, len(data)+len(sum)+48)
	out = fmt.Appendf(out, `{"version":%d,"checksum":%q,"data":`, Version, sum)
	out = append(out, data...)
	return append(out, '}')
}

// marshal encodes d as a snapshot with no journal (tests, tools).
func marshal(d *Data) ([]byte, error) {
	s, err := stateOf(d)
	if err != nil {
		return nil, err
	}
	return marshalSnapshot(0, s), nil
}

// unmarshalSnapshot decodes and verifies a snapshot of version 1 or 2.
// Errors wrap ErrCorrupt.
func unmarshalSnapshot(b []byte) (*snapshot, error) {
	var env envelope
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the checkpoint", ErrCorrupt)
	}
	if env.Version != 1 && env.Version != Version {
		return nil, fmt.Errorf("%w: version %d, want 1 or %d", ErrCorrupt, env.Version, Version)
	}
	if len(env.Data) == 0 {
		return nil, fmt.Errorf("%w: no data", ErrCorrupt)
	}
	if got := checksum(env.Data); got != env.Checksum {
		return nil, fmt.Errorf("%w: checksum %s, computed %s", ErrCorrupt, env.Checksum, got)
	}
	var raw struct {
		Journal     *uint64           `json:"journal"`
		Resources   []json.RawMessage `json:"resources"`
		Allocations []json.RawMessage `json:"allocations"`
		Claims      []json.RawMessage `json:"claims"`
	}
	if err := json.Unmarshal(env.Data, &raw); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	snap := &snapshot{version: env.Version, state: newState()}
	switch {
	case env.Version == 1 && raw.Journal != nil:
		return nil, fmt.Errorf("%w: a version 1 checkpoint names a journal", ErrCorrupt)
	case env.Version == Version && raw.Journal == nil:
		return nil, fmt.Errorf("%w: a version %d snapshot names no journal", ErrCorrupt, Version)
	case raw.Journal != nil:
		snap.journal = *raw.Journal
	}
	for _, r := range raw.Resources {
		if err := snap.state.putResource(r); err != nil {
			return nil, err
		}
	}
	for _, a := range raw.Allocations {
		if err := snap.state.putAllocation(a); err != nil {
			return nil, err
		}
	}
	for _, c := range raw.Claims {
		if err := snap.state.putClaim(c); err != nil {
			return nil, err
		}
	}
	return snap, nil
}

// unmarshal decodes and verifies a snapshot into Data. Errors wrap
// ErrCorrupt.
func unmarshal(b []byte) (*Data, error) {
	snap, err := unmarshalSnapshot(b)
	if err != nil {
		return nil, err
	}
	return snap.state.data()
}

// readRegular reads the file at path without following a symlink and
// without blocking on a FIFO. A missing file returns (nil, nil); anything
// at path that is not a readable regular file is an error wrapping
// ErrCorrupt.
func readRegular(path string) ([]byte, error) {
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
	if b == nil {
		b = []byte{}
	}
	return b, nil
}

// ReadFile reads the snapshot at path alone (not its journal). A missing
// file returns (nil, nil). A corrupt file returns an error wrapping
// ErrCorrupt, and so does anything at path that is not a regular file: it
// is opened without following symlinks (a link planted there is never
// read through), and without blocking on a FIFO.
func ReadFile(path string) (*Data, error) {
	b, err := readRegular(path)
	if err != nil || b == nil {
		return nil, err
	}
	return unmarshal(b)
}

// asideTime formats the time in a moved-aside file's name.
const asideTime = "20060102T150405.000000000Z"

// moveAside renames a corrupt file to <path>.corrupt-<timestamp> and
// returns the new name.
func moveAside(path string, now time.Time) (string, error) {
	aside := fmt.Sprintf("%s.corrupt-%s", path, now.UTC().Format(asideTime))
	if err := os.Rename(path, aside); err != nil {
		return "", err
	}
	return aside, atomicfile.SyncDir(filepath.Dir(path))
}

// writeSnapshot writes a snapshot atomically (atomicfile.WriteFile: its
// temporary file is .nodeplug_checkpoint.tmp-*, which removeTemps knows).
func writeSnapshot(path string, journal uint64, s *state) (int64, error) {
	b := marshalSnapshot(journal, s)
	return int64(len(b)), atomicfile.WriteFile(path, b)
}
