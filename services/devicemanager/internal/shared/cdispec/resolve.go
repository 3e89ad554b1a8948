package cdispec

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// Resolution reads the spec files as CDI does (cdi.ReadSpec: the .json
// and .yaml files of each search directory, not its subdirectories, each
// parsed and validated), but not all of them at every start: a node with
// a thousand allocated containers has a thousand of nodeplug's own specs,
// and reading them all again cost a start about 270 ms
// (BenchmarkStartContainer). So:
//   - a name of nodeplug's kind is looked up in the one file that can
//     define it, Dir's spec of that container;
//   - the other names are looked up in the other spec files, each read
//     again only when its size, modification time or inode changed since
//     it was last read (nodeplug's own files, which define only its kind,
//     are not read for them).

// fileID tells whether a spec file changed since it was read.
type fileID struct {
	size  int64
	mtime time.Time
	ino   uint64
}

func idOf(info fs.FileInfo) fileID {
	id := fileID{size: info.Size(), mtime: info.ModTime()}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		id.ino = st.Ino
	}
	return id
}

// readSpec is one spec file as last read: the qualified names of its
// devices, or why it did not load.
type readSpec struct {
	id      fileID
	devices []string
	err     error
}

// Resolve checks that every name is a qualified CDI device name defined by
// a spec in the search directories (see above). A name that is not is
// errdefs.ErrFailedPrecondition naming it and the directories (and what
// was wrong with a spec file of its vendor and class, if any).
func (s *Specs) Resolve(names []string) error {
	s.mu.Lock()
	defined := s.foreignLocked()
	var missing []string
	for _, n := range names {
		if !s.definedLocked(n, defined) {
			missing = append(missing, n)
		}
	}
	var why []string
	if len(missing) > 0 {
		why = s.specErrorsLocked(missing)
	}
	s.mu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	verb := "does not resolve"
	if len(missing) > 1 {
		verb = "do not resolve"
	}
	msg := fmt.Sprintf("CDI device%s %s %s in the CDI spec directories %s", plural(missing), quoteAll(missing), verb, strings.Join(s.dirs, ", "))
	if len(why) > 0 {
		msg += " (spec files with errors: " + strings.Join(why, "; ") + ")"
	}
	return fmt.Errorf("%s: %w", msg, errdefs.ErrFailedPrecondition)
}

func plural(names []string) string {
	if len(names) > 1 {
		return "s"
	}
	return ""
}

// definedLocked reports whether name is defined: a name of nodeplug's kind
// by its container's spec in Dir, any other by a spec file in defined.
func (s *Specs) definedLocked(name string, defined map[string]bool) bool {
	vendor, class, device, err := parser.ParseQualifiedName(name)
	if err != nil {
		return false
	}
	if vendor != Vendor || class != Class {
		return defined[name]
	}
	path := filepath.Join(s.dir, specName(device)+specExt)
	spec, err := cdi.ReadSpec(path, slices.Index(s.dirs, s.dir))
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			s.files[path] = &readSpec{err: err}
		}
		return false
	}
	delete(s.files, path)
	return spec.GetDevice(device) != nil
}

// foreignLocked returns the qualified device names the spec files other
// than nodeplug's own define, reading again those that changed, and
// forgets the files that are gone.
func (s *Specs) foreignLocked() map[string]bool {
	defined := map[string]bool{}
	seen := map[string]bool{}
	for prio, dir := range s.dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue // a missing directory defines nothing, as in CDI
		}
		for _, ent := range entries {
			name := ent.Name()
			if ent.IsDir() || (filepath.Ext(name) != ".json" && filepath.Ext(name) != ".yaml") ||
				(dir == s.dir && strings.HasPrefix(name, specPrefix)) {
				continue
			}
			info, err := ent.Info()
			if err != nil {
				continue // removed since the directory was read
			}
			path := filepath.Join(dir, name)
			seen[path] = true
			r := s.files[path]
			if id := idOf(info); r == nil || r.id != id {
				r = &readSpec{id: id}
				spec, err := cdi.ReadSpec(path, prio)
				if err != nil {
					r.err = err
				} else {
					for _, d := range spec.Devices {
						r.devices = append(r.devices, parser.QualifiedName(spec.GetVendor(), spec.GetClass(), d.Name))
					}
				}
				s.files[path] = r
			}
			for _, d := range r.devices {
				defined[d] = true
			}
		}
	}
	for path := range s.files {
		if !seen[path] && !strings.HasPrefix(filepath.Base(path), specPrefix) {
			delete(s.files, path)
		}
	}
	return defined
}

// specErrorsLocked returns the errors of the spec files whose names start
// with the vendor and class of a missing name (what a user looks at
// next).
func (s *Specs) specErrorsLocked(missing []string) []string {
	var out []string
	for path, r := range s.files {
		if r.err == nil {
			continue
		}
		base := filepath.Base(path)
		for _, n := range missing {
			vendor, class, _ := parser.ParseDevice(n)
			if vendor != "" && strings.HasPrefix(base, vendor+"-"+class) {
				out = append(out, fmt.Sprintf("%s: %v", path, r.err))
				break
			}
		}
	}
	slices.Sort(out)
	return out
}
