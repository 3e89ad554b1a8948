// This file is the mirror of the state in the kubelet's checkpoint format
// (kubelet.go), for the tools that watch or read
// device-plugins/kubelet_internal_checkpoint (node-feature-discovery's
// topology updater rescans when it changes). The Store it wraps stays the
// source of truth: the mirror is rewritten in the background, never on the
// path of a change.

package store

import (
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nodeplug/nodeplug/services/internal/atomicfile"
)

// KubeletInterval is the least time between two writes of the mirror: a
// change is in the file at most about this long after it was made.
const KubeletInterval = 100 * time.Millisecond

// KubeletMirror is a Store that keeps, beside the Store it wraps, a mirror
// of the state in the kubelet's own checkpoint format (KubeletFileName in
// the same directory): every resource with its healthy devices, every
// allocation with its devices by NUMA node and the plugin's answer, and the
// kubelet's checksum, so that the kubelet's checkpoint code reads it back.
//
// Append records the change in memory and signals a background writer
// without waiting for it; the writer rewrites the whole file atomically
// (temporary file, fsync, rename, fsync of the directory), at most once
// per KubeletInterval, so that a burst of changes costs a few writes, and
// the last state always lands. Flush writes it a last time.
//
// At Load, when the wrapped Store has no saved state (a first start) and a
// kubelet checkpoint is there, its allocations are imported: made durable
// in the wrapped Store, logged, and returned as the loaded state. A kubelet
// checkpoint that cannot be read is moved aside (a *CorruptError). Nothing
// is written to the mirror before Load has succeeded.
type KubeletMirror struct {
	inner    Store
	path     string
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu          sync.Mutex // orders Appends and guards the mirrored state
	resources   map[string]Resource
	allocations map[AllocationKey]Allocation
	changes     uint64 // bumped by every change mirrored
	announced   bool   // the first Append after Load signalled the writer

	signal   chan struct{} // a change to write; never blocks its sender
	stop     chan struct{}
	done     chan struct{}
	started  bool
	stopOnce sync.Once

	writeMu sync.Mutex // one write at a time: the writer's, Flush's
	written uint64     // the changes count last written
	failing bool       // the last write failed (logged once, and its recovery)

	writes atomic.Uint64 // files installed, for tests
	// beforeInstall, when set (tests), runs after the temporary file is
	// written and before it is made durable and renamed into place.
	beforeInstall func()
}

var _ Store = (*KubeletMirror)(nil)

// WithKubeletMirror wraps s, which keeps its state in dir, in a
// KubeletMirror that writes dir/KubeletFileName.
func WithKubeletMirror(s Store, dir string, log *slog.Logger) *KubeletMirror {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &KubeletMirror{
		inner: s, path: KubeletPath(dir), log: log, interval: KubeletInterval, now: time.Now,
		resources: map[string]Resource{}, allocations: map[AllocationKey]Allocation{},
		signal: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
	}
}

// KubeletPath returns the path of the kubelet's checkpoint in dir.
func KubeletPath(dir string) string { return filepath.Join(dir, KubeletFileName) }

// Location implements Store: the wrapped Store's.
func (k *KubeletMirror) Location() string { return k.inner.Location() }

// Load implements Store: the wrapped Store's state or, at a first start,
// the allocations imported from the kubelet's checkpoint (see
// KubeletMirror). The writer starts once the state is known.
func (k *KubeletMirror) Load() (*Data, error) {
	removeKubeletTemps(filepath.Dir(k.path))
	d, err := k.inner.Load()
	if !OnlyCorruptions(err) {
		return d, err
	}
	if d == nil && err == nil {
		if d, err = k.importKubelet(); !OnlyCorruptions(err) {
			return nil, err
		}
	}
	k.mu.Lock()
	if d != nil {
		for _, r := range d.Resources {
			k.resources[r.Name] = r
		}
		for _, a := range d.Allocations {
			k.allocations[a.Key()] = a
		}
	}
	k.changes++ // the mirror on disk may be older than the state
	k.started = true
	k.mu.Unlock()
	go k.run()
	return d, err
}

// Append implements Store: the change goes to the wrapped Store, then into
// the mirrored state, and the writer is told. The first Append after Load
// tells it even when it changes nothing, so that a mirror a previous run
// left behind is rewritten from the restored state.
func (k *KubeletMirror) Append(b Batch) (Ticket, error) {
	k.mu.Lock()
	t, err := k.inner.Append(b)
	if err != nil {
		k.mu.Unlock()
		return t, err
	}
	tell := !b.Empty() || !k.announced
	k.announced = true
	if !b.Empty() {
		k.applyLocked(&b)
	}
	k.mu.Unlock()
	if tell {
		select {
		case k.signal <- struct{}{}:
		default: // a write is already due; it will read this change
		}
	}
	return t, nil
}

func (k *KubeletMirror) applyLocked(b *Batch) {
	for _, r := range b.Resources {
		k.resources[r.Name] = r
	}
	for _, name := range b.RemovedResources {
		delete(k.resources, name)
	}
	for _, a := range b.Allocations {
		k.allocations[a.Key()] = a
	}
	for _, key := range b.RemovedAllocations {
		delete(k.allocations, key)
	}
	k.changes++
}

// Wait implements Store: the wrapped Store's.
func (k *KubeletMirror) Wait(t Ticket) error { return k.inner.Wait(t) }

// Flush implements Store: it flushes the wrapped Store, stops the writer
// and writes the mirror a last time. A failure to write the mirror is
// logged, not returned: the state itself is safe.
func (k *KubeletMirror) Flush() error {
	err := k.inner.Flush()
	k.mu.Lock()
	started := k.started
	k.mu.Unlock()
	if !started {
		return err
	}
	k.stopOnce.Do(func() { close(k.stop) })
	<-k.done
	_ = k.write()
	return err
}

// run is the writer: on a signal it writes the mirror, no sooner than
// k.interval after its last write, until Flush stops it.
func (k *KubeletMirror) run() {
	defer close(k.done)
	var last time.Time
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		select {
		case <-k.stop:
			return
		case <-k.signal:
		}
		if wait := k.interval - k.now().Sub(last); wait > 0 && !last.IsZero() {
			timer.Reset(wait)
			select {
			case <-k.stop:
				timer.Stop()
				return
			case <-timer.C:
			}
		}
		// Changes from here on signal again; those before are read now.
		select {
		case <-k.signal:
		default:
		}
		if k.write() != nil {
			// Try again after the interval, even if nothing changes.
			select {
			case k.signal <- struct{}{}:
			default:
			}
		}
		last = k.now()
	}
}

// write writes the mirrored state, unless it is already on disk.
func (k *KubeletMirror) write() error {
	k.writeMu.Lock()
	defer k.writeMu.Unlock()
	k.mu.Lock()
	changes := k.changes
	if changes == k.written {
		k.mu.Unlock()
		return nil
	}
	resources := slices.Collect(maps.Values(k.resources))
	allocations := slices.Collect(maps.Values(k.allocations))
	k.mu.Unlock()

	b, err := marshalKubelet(resources, allocations)
	if err == nil {
		err = k.writeFile(b)
	}
	if err != nil {
		if !k.failing {
			k.log.Error("writing the kubelet-format checkpoint mirror failed; retrying (nodeplug's own checkpoint is not affected)",
				"path", k.path, "error", err)
		}
		k.failing = true
		return err
	}
	if k.failing {
		k.log.Info("the kubelet-format checkpoint mirror is written again", "path", k.path)
	}
	k.failing = false
	k.written = changes
	k.writes.Add(1)
	return nil
}

// writeFile replaces the mirror with b atomically: a new temporary file
// (mode 0600, never an existing file or a planted link) in the same
// directory, fsync, rename over the mirror (which replaces a link rather
// than writing through it), fsync of the directory. The temporary name
// starts with a dot, so that the kubelet's checkpoint listing skips it.
func (k *KubeletMirror) writeFile(b []byte) error {
	f, err := atomicfile.CreateTemp(filepath.Dir(k.path), kubeletTempPrefix)
	if err != nil {
		return fmt.Errorf("write %s: %w", k.path, err)
	}
	if _, err := f.Write(b); err != nil {
		atomicfile.Discard(f)
		return fmt.Errorf("write %s: %w", f.Name(), err)
	}
	if k.beforeInstall != nil {
		k.beforeInstall()
	}
	return atomicfile.Install(f, k.path)
}

var kubeletTempPrefix = atomicfile.TempPrefix(KubeletFileName)

// removeKubeletTemps removes temporary mirror files a crash left behind.
func removeKubeletTemps(dir string) {
	atomicfile.RemoveTemps(dir, kubeletTempPrefix)
}

// importKubelet imports the allocations of the kubelet's checkpoint into
// the wrapped Store, which has no saved state: it returns them as the
// loaded state, or nil when there is no kubelet checkpoint or it holds
// none. A kubelet checkpoint that cannot be read or verified is moved
// aside and returned as a *CorruptError; an import that cannot be made
// durable is an error (and the kubelet's file is left as it is).
func (k *KubeletMirror) importKubelet() (*Data, error) {
	now := k.now()
	b, err := readRegular(k.path)
	if err == nil && b == nil {
		return nil, nil
	}
	var allocs []Allocation
	var skipped []string
	if err == nil {
		var d *kubeletData
		if d, err = unmarshalKubelet(b); err == nil {
			allocs, skipped = kubeletAllocations(d, now)
		}
	}
	if err != nil {
		aside, merr := moveAside(k.path, now)
		if merr != nil {
			return nil, fmt.Errorf("the kubelet's checkpoint %s cannot be imported (%v) and could not be moved aside: %w", k.path, err, merr)
		}
		return nil, &CorruptError{Path: k.path, MovedTo: aside, Err: fmt.Errorf("the kubelet's checkpoint: %w", err)}
	}
	for _, s := range skipped {
		k.log.Warn("kubelet checkpoint: allocation not imported", "path", k.path, "reason", s)
	}
	if len(allocs) == 0 {
		k.log.Info("kubelet checkpoint found at first start; it holds no allocations to import", "path", k.path, "skipped", len(skipped))
		return nil, nil
	}
	if err := Commit(k.inner, Batch{Allocations: allocs}); err != nil {
		return nil, fmt.Errorf("import the kubelet's allocations from %s: %w", k.path, err)
	}
	pods, devices := map[string]bool{}, 0
	for _, a := range allocs {
		pods[a.PodUID] = true
		devices += len(a.DeviceIDs)
		k.log.Info("imported allocation from the kubelet's checkpoint", "pod_uid", a.PodUID, "container", a.ContainerName,
			"resource", a.ResourceName, "devices", a.DeviceIDs)
	}
	k.log.Info("imported the kubelet's allocations (migration from a kubelet)", "path", k.path,
		"allocations", len(allocs), "pods", len(pods), "devices", devices, "skipped", len(skipped))
	return &Data{Resources: []Resource{}, Allocations: allocs}, nil
}

// ReadKubelet reads the kubelet-format checkpoint at path and returns its
// allocations and, per resource, the devices it lists as healthy (tests,
// tools). A missing file returns (nil, nil, nil); a file that is not a
// valid kubelet checkpoint, or not a regular file, is an error wrapping
// ErrCorrupt.
func ReadKubelet(path string) ([]Allocation, map[string][]string, error) {
	b, err := readRegular(path)
	if err != nil || b == nil {
		return nil, nil, err
	}
	d, err := unmarshalKubelet(b)
	if err != nil {
		return nil, nil, err
	}
	allocs, skipped := kubeletAllocations(d, time.Time{})
	if len(skipped) > 0 {
		return nil, nil, fmt.Errorf("%w: %s", ErrCorrupt, strings.Join(skipped, "; "))
	}
	return allocs, d.RegisteredDevices, nil
}
