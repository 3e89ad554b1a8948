package socketwatch

// The filesystem side of the watcher: fsnotify events and errors, the
// watches on the tree and its parent, and the scans that read sockets and
// their generations.

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"

	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

func (w *Watcher) handleEvent(ev fsnotify.Event) {
	if w.dropEvent != nil && w.dropEvent(ev) {
		return
	}
	name := filepath.Clean(ev.Name)
	removed := ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)
	if name == w.dir {
		switch {
		case removed:
			w.rootGone()
		case ev.Has(fsnotify.Create):
			// Someone else recreated the directory first.
			w.metrics.rescans.Inc()
			w.sync(w.dir, causeRescan)
		}
		return
	}
	if w.hidden(name) {
		return
	}
	switch {
	case ev.Has(fsnotify.Create):
		w.sync(name, causeEvent)
	case removed:
		if ev.Has(fsnotify.Rename) {
			w.unwatch(name)
		}
		w.forget(name, causeEvent)
	}
}

func (w *Watcher) handleError(err error) {
	if errors.Is(err, fsnotify.ErrEventOverflow) {
		w.metrics.rescans.Inc()
		w.log.Warn("fsnotify queue overflowed; rescanning the plugin directory", "dir", w.dir)
		w.sync(w.dir, causeRescan)
		return
	}
	w.log.Error("fsnotify error", "dir", w.dir, "error", err)
}

// watchParent watches the directory above the watched one, for the removal
// or move of the watched directory itself: the kernel reports the deletion of
// a directory on its own watch only once nothing pins it, and a plugin's open
// listener pins every directory above its socket. Events for the parent's
// other entries are ignored. A failure only loses that early notice.
func (w *Watcher) watchParent() {
	parent := filepath.Dir(w.dir)
	if parent == w.dir {
		return
	}
	if err := w.fsw.Add(parent); err != nil {
		w.log.Warn("cannot watch the parent of the plugin directory; its removal will go unnoticed", "dir", parent, "error", err)
	}
}

// rootGone handles the removal or move of the watched directory itself: every
// socket is gone; the directory is created again and watched anew.
func (w *Watcher) rootGone() {
	w.log.Warn("plugin directory was removed or moved; recreating it", "dir", w.dir)
	w.unwatch(w.dir)
	w.forget(w.dir, causeEvent)
	if err := os.MkdirAll(w.dir, 0o750); err != nil {
		w.log.Error("recreate plugin directory", "dir", w.dir, "error", err)
		return
	}
	w.watchParent()
	w.metrics.rescans.Inc()
	w.sync(w.dir, causeRescan)
}

// unwatch drops the fsnotify watches of dir and of every directory below it
// (after a move, the kernel keeps them on the moved inodes, under stale
// names).
func (w *Watcher) unwatch(dir string) {
	for _, p := range w.fsw.WatchList() {
		if within(p, dir) {
			_ = w.fsw.Remove(p)
		}
	}
}

// hidden reports whether p is outside the watched tree or has a component
// below it that starts with ".".
func (w *Watcher) hidden(p string) bool { return hiddenBelow(w.dir, p) }

// hiddenBelow reports whether p is outside the directory dir (absolute and
// clean) or has a component below it that starts with "." (the watcher
// contract's rule for what does not count; "." and ".." included). dir
// itself is not hidden.
func hiddenBelow(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return true
	}
	if rel == "." {
		return false
	}
	for _, c := range strings.Split(rel, string(filepath.Separator)) {
		if strings.HasPrefix(c, ".") {
			return true
		}
	}
	return false
}

// within reports whether p is dir or lies below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, dir+string(filepath.Separator))
}

// scan returns the sockets at or below p (path → generation), adding an
// fsnotify watch to every directory before reading it.
func (w *Watcher) scan(p string) map[string]string {
	found := map[string]string{}
	w.visit(p, found)
	return found
}

func (w *Watcher) visit(p string, found map[string]string) {
	if w.hidden(p) {
		return
	}
	stat := os.Lstat
	if p == w.dir {
		stat = os.Stat // the root may itself be a symlink to a directory
	}
	fi, err := stat(p)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			w.log.Warn("cannot stat path in plugin directory", "path", p, "error", err)
		}
		return
	}
	if fi.IsDir() {
		// Watch first, read second: whatever is created after the watch is
		// added raises an event, whatever before is in the listing.
		if err := w.fsw.Add(p); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				w.log.Error("cannot watch directory", "dir", p, "error", err)
			}
			return
		}
		entries, err := os.ReadDir(p)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				w.log.Warn("cannot read directory", "dir", p, "error", err)
			}
			return
		}
		for _, e := range entries {
			w.visit(filepath.Join(p, e.Name()), found)
		}
		return
	}
	if gen, ok := w.socketGeneration(p, fi.Mode()); ok {
		found[p] = gen
	}
}

// socketGeneration returns the generation of p when it counts as a socket.
func (w *Watcher) socketGeneration(p string, mode fs.FileMode) (string, bool) {
	target := p
	switch {
	case mode&fs.ModeSocket != 0:
	case mode&fs.ModeSymlink != 0:
		if w.conf == nil {
			return "", false
		}
		resolved, err := w.conf.Resolve(p)
		if err != nil {
			w.log.Debug("ignoring symlink", "path", p, "reason", err)
			return "", false
		}
		target = resolved
	default:
		return "", false
	}
	id, m, err := unixsock.Stat(target)
	if err != nil || m&fs.ModeSocket == 0 {
		return "", false
	}
	return id.Generation(), true
}
