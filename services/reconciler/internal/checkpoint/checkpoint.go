// Package checkpoint keeps the reconciler's registrations across its
// restarts: every plugin it registered and told so
// (NotifyRegistrationStatus(true)), by registration socket and generation,
// in one file (<root>/nodeplug/registrations.json) written whole.
//
// A reconciler that starts again (an upgrade, a crash, systemd restarting
// it) adopts each registration of the file whose socket still has the same
// generation: it registers it with its handler again, which is a no-op
// downstream when the handler's peer kept it, without contacting the plugin.
// So no plugin sees GetInfo or NotifyRegistrationStatus again. The
// kubelet's plugin manager keeps nothing and registers every plugin again
// when it starts.
//
// Changes are written in the background, coalesced: a burst of N
// registrations costs a few writes, not N. A registration that is not on
// disk yet when the process dies is made again by the next reconciler, from
// GetInfo on, as the kubelet would: the file only ever saves work, so a
// damaged or missing file costs nothing but that.
package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/services/internal/atomicfile"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// Kind and Version head the file: a file of another kind or version is
// not read (its registrations are made again).
const (
	Kind    = "nodeplug-reconciler-registrations"
	Version = 1
)

// DefaultInterval is the least time between two writes of the file. Each
// write marshals every registration, so in a burst of a thousand
// registrations a write per 100 ms cost the reconciler a few percent of
// its CPU; a registration that misses the file before a crash is only
// made again from GetInfo on.
const DefaultInterval = time.Second

// maxFile bounds what Open reads: far above any real file (a registration
// is a few hundred bytes), it keeps a damaged or planted file from costing
// memory.
const maxFile = 64 << 20

// A registration is the ASW's entry of a plugin the reconciler registered
// and told so (cache.Plugin); its Handler is not kept.

// File is the registrations file: what it holds, and the writer that keeps
// it current. Its methods are safe for concurrent use.
type File struct {
	path     string
	log      *slog.Logger
	interval time.Duration
	loaded   []cache.Plugin

	mu      sync.Mutex
	regs    map[string]cache.Plugin // by socket path
	changes uint64                  // bumped by every change
	saved   uint64                  // changes on disk
	failing bool                    // the last write failed
	kick    chan struct{}

	writeMu sync.Mutex // one write at a time
}

// Options configure a File.
type Options struct {
	Log *slog.Logger
	// Interval is the least time between two writes (DefaultInterval
	// when 0).
	Interval time.Duration
}

// Open reads the file at path, which need not exist, and returns it ready
// to be written. A file that cannot be read is reported in the error, and
// the File returned anyway starts empty: its registrations are made again,
// and the next write replaces it.
func Open(path string, o Options) (*File, error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	f := &File{path: path, log: o.Log, interval: o.Interval, regs: map[string]cache.Plugin{}, kick: make(chan struct{}, 1)}
	atomicfile.RemoveTemps(filepath.Dir(path), atomicfile.TempPrefix(path))
	regs, err := read(path)
	if err != nil {
		return f, err
	}
	for _, r := range regs {
		f.regs[r.SocketPath] = r
	}
	f.loaded = regs
	return f, nil
}

// Path is where the file is.
func (f *File) Path() string { return f.path }

// Loaded returns the registrations the file held when it was opened.
func (f *File) Loaded() []cache.Plugin { return slices.Clone(f.loaded) }

// Put records r, replacing what its socket path had.
func (f *File) Put(r cache.Plugin) {
	r.Versions, r.Handler = slices.Clone(r.Versions), nil
	f.mu.Lock()
	f.regs[r.SocketPath] = r
	f.changes++
	f.mu.Unlock()
	f.signal()
}

// Delete forgets the registration of the socket at path if its generation
// is generation: a newer generation put meanwhile stays.
func (f *File) Delete(path, generation string) {
	f.mu.Lock()
	r, ok := f.regs[path]
	if ok && r.Generation == generation {
		delete(f.regs, path)
		f.changes++
	}
	f.mu.Unlock()
	if ok {
		f.signal()
	}
}

// List returns the registrations recorded now, sorted by socket path.
func (f *File) List() []cache.Plugin {
	f.mu.Lock()
	defer f.mu.Unlock()
	return sorted(f.regs)
}

func (f *File) signal() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// Run writes the changes in the background until ctx ends, at most one
// write per interval. It does not write what is left at the end: call
// Flush once nothing changes any more.
func (f *File) Run(ctx context.Context) error {
	t := time.NewTimer(f.interval)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.kick:
		}
		if err := f.Flush(); err != nil {
			f.mu.Lock()
			warn := !f.failing
			f.failing = true
			f.mu.Unlock()
			lvl := slog.LevelDebug
			if warn {
				lvl = slog.LevelWarn
			}
			f.log.Log(ctx, lvl, "writing the registrations file failed; retrying (a reconciler started meanwhile registers its plugins again)", "path", f.path, "error", err)
			f.signal()
		} else {
			f.mu.Lock()
			if f.failing {
				f.log.Info("the registrations file is written again", "path", f.path)
			}
			f.failing = false
			f.mu.Unlock()
		}
		t.Reset(f.interval)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Flush writes the registrations if they changed since the last write.
func (f *File) Flush() error {
	f.writeMu.Lock()
	defer f.writeMu.Unlock()
	f.mu.Lock()
	changes := f.changes
	if changes == f.saved {
		f.mu.Unlock()
		return nil
	}
	regs := sorted(f.regs)
	f.mu.Unlock()
	b, err := marshal(regs)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(f.path, b); err != nil {
		return err
	}
	f.mu.Lock()
	f.saved = max(f.saved, changes)
	f.mu.Unlock()
	return nil
}

func sorted(m map[string]cache.Plugin) []cache.Plugin {
	return slices.SortedFunc(maps.Values(m), func(a, b cache.Plugin) int { return strings.Compare(a.SocketPath, b.SocketPath) })
}

// The file's format: JSON, its registrations' checksum (CRC-32C of the
// registrations array as written) beside them. Every string goes through
// bounds.PathText, so that a socket path or a name that is not UTF-8 comes
// back byte for byte.
type fileJSON struct {
	Kind          string          `json:"kind"`
	Version       int             `json:"version"`
	Checksum      string          `json:"checksum"`
	Registrations json.RawMessage `json:"registrations"`
}

type registrationJSON struct {
	SocketPath string   `json:"socket_path"`
	Generation string   `json:"generation"`
	Type       string   `json:"type"`
	Name       string   `json:"name"`
	Endpoint   string   `json:"endpoint,omitempty"`
	Versions   []string `json:"versions,omitempty"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func checksum(b []byte) string { return fmt.Sprintf("crc32c:%08x", crc32.Checksum(b, castagnoli)) }

func marshal(regs []cache.Plugin) ([]byte, error) {
	out := make([]registrationJSON, 0, len(regs))
	for _, r := range regs {
		j := registrationJSON{SocketPath: bounds.PathText(r.SocketPath), Generation: bounds.PathText(r.Generation),
			Type: bounds.PathText(r.Type), Name: bounds.PathText(r.Name), Endpoint: bounds.PathText(r.Endpoint)}
		for _, v := range r.Versions {
			j.Versions = append(j.Versions, bounds.PathText(v))
		}
		out = append(out, j)
	}
	raw, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	// Compact: jq shows it indented, and a burst of registrations
	// rewrites it often.
	b, err := json.Marshal(fileJSON{Kind: Kind, Version: Version, Checksum: checksum(raw), Registrations: raw})
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// read returns the registrations of the file at path: none when there is
// no file.
func read(path string) ([]cache.Plugin, error) {
	fh, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = fh.Close() }()
	st, err := fh.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if st.Size() > maxFile {
		return nil, fmt.Errorf("%s holds %d bytes, more than the %d a registrations file may", path, st.Size(), maxFile)
	}
	b := make([]byte, st.Size())
	if _, err := fh.ReadAt(b, 0); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return unmarshal(path, b)
}

func unmarshal(path string, b []byte) ([]cache.Plugin, error) {
	var f fileJSON
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("%s is not a registrations file: %w", path, err)
	}
	if f.Kind != Kind || f.Version != Version {
		return nil, fmt.Errorf("%s is of kind %q version %d; this reconciler reads %q version %d", path, f.Kind, f.Version, Kind, Version)
	}
	if got := checksum(compact(f.Registrations)); got != f.Checksum {
		return nil, fmt.Errorf("%s is damaged: its registrations' checksum is %s, the file says %s", path, got, f.Checksum)
	}
	var regs []registrationJSON
	if err := json.Unmarshal(f.Registrations, &regs); err != nil {
		return nil, fmt.Errorf("%s: registrations: %w", path, err)
	}
	out := make([]cache.Plugin, 0, len(regs))
	for i, j := range regs {
		r, err := fromJSON(j)
		if err != nil {
			return nil, fmt.Errorf("%s: registration %d: %w", path, i, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// compact is the registrations array as marshal checksummed it, whatever
// indentation the file has.
func compact(raw json.RawMessage) []byte {
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return raw
	}
	return b.Bytes()
}

func fromJSON(j registrationJSON) (cache.Plugin, error) {
	var r cache.Plugin
	var err error
	field := func(name, text string) string {
		if err != nil {
			return ""
		}
		v, ferr := bounds.PathFromText(text)
		if ferr != nil {
			err = fmt.Errorf("%s: %w", name, ferr)
		}
		return v
	}
	r.SocketPath = field("socket_path", j.SocketPath)
	r.Generation = field("generation", j.Generation)
	r.Type = field("type", j.Type)
	r.Name = field("name", j.Name)
	r.Endpoint = field("endpoint", j.Endpoint)
	for _, v := range j.Versions {
		r.Versions = append(r.Versions, field("versions", v))
	}
	if err != nil {
		return cache.Plugin{}, err
	}
	if r.SocketPath == "" || r.Generation == "" || r.Type == "" {
		return cache.Plugin{}, errors.New("socket_path, generation and type must be set")
	}
	return r, nil
}
