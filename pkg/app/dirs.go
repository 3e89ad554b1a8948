package app

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"github.com/nodeplug/nodeplug/pkg/layout"
)

// The directories a service needs: its root dir and its API socket's
// directory. A service sets the mode and group only of a directory it
// creates itself, through the directory it created (never through a path
// that may have been swapped since): a directory that was there before is
// someone's choice (/tmp, /run, an operator's) and is left as it is. A
// symbolic link is never followed where nodeplug names the directory
// itself (<root>/nodeplug), and an API socket is never put in a directory
// that anyone may write to, where anyone could put another socket in its
// place.

// rootDirMode is the mode of a root dir the service creates, given the
// group that may reach the API sockets beneath it (-1: the process's own).
// With --api-group, the directory is that group's and 0710: its members
// may pass through it to <root>/nodeplug (0750, the same group) but not
// list it, and nobody else may enter it. Without, it is 0750 of the
// process's group, as DESIGN says.
func rootDirMode(apiGID int) fs.FileMode {
	if apiGID >= 0 {
		return 0o710
	}
	return 0o750
}

// makeRootDir creates the root dir, and the directories above it that are
// missing, each with rootDirMode and the API group; directories that are
// there are left alone.
func makeRootDir(root string, apiGID int) error {
	if _, err := makeDirs(root, rootDirMode(apiGID), apiGID); err != nil {
		return fmt.Errorf("create root dir: %w", err)
	}
	return nil
}

// makeDirs creates dir and the missing directories above it, each with
// mode and, when gid >= 0, group gid, and reports whether it created dir.
// Directories already there are not changed.
func makeDirs(dir string, mode fs.FileMode, gid int) (bool, error) {
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	switch {
	case err == nil && fi.IsDir():
		return false, nil
	case err == nil:
		return false, fmt.Errorf("%s is not a directory (%s)", dir, fi.Mode().Type())
	case !errors.Is(err, fs.ErrNotExist):
		return false, err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if _, err := makeDirs(parent, mode, gid); err != nil {
			return false, err
		}
	}
	return makeDir(dir, mode, gid)
}

// makeDir creates dir (its parent exists) with mode and, when gid >= 0,
// group gid, and reports whether it did: a directory already there (made
// meanwhile by another service on the same root) is left as it is. The
// mode and group are set on the directory created, opened without
// following a symbolic link.
func makeDir(dir string, mode fs.FileMode, gid int) (bool, error) {
	if err := os.Mkdir(dir, mode); err != nil {
		if errors.Is(err, fs.ErrExist) {
			if fi, serr := os.Stat(dir); serr == nil && fi.IsDir() {
				return false, nil
			}
		}
		return false, err
	}
	f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return true, fmt.Errorf("open the directory %s just created: %w", dir, err)
	}
	defer f.Close()
	// The umask may have taken bits away.
	if err := f.Chmod(mode); err != nil {
		return true, fmt.Errorf("set the mode of %s: %w", dir, err)
	}
	if gid >= 0 {
		if err := f.Chown(-1, gid); err != nil {
			return true, fmt.Errorf("set the group of %s to %d: %w", dir, gid, err)
		}
	}
	return true, nil
}

// apiDir makes ready the directory of the API socket path: created 0750 of
// group gid when missing; when there, left as it is, unless it is
// <root>/nodeplug as a symbolic link (refused: nodeplug names that
// directory and does not follow a link planted there) or a directory
// anyone may write to (refused: anyone could replace the socket). A
// directory there of another group than --api-group is logged: its
// members may not reach the socket.
func apiDir(root, path string, gid int, log *slog.Logger) error {
	dir := filepath.Clean(filepath.Dir(path))
	noLink := func() error {
		if dir != filepath.Clean(layout.APIDir(root)) {
			return nil
		}
		if fi, err := os.Lstat(dir); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			target, _ := os.Readlink(dir)
			return fmt.Errorf("the API socket directory %s is a symbolic link (to %q), which nodeplug does not follow: remove it, and the service creates the directory", dir, target)
		}
		return nil
	}
	// Before, for a clear error, and after, for a link planted meanwhile.
	if err := noLink(); err != nil {
		return err
	}
	created, err := makeDirs(dir, 0o750, gid)
	if err != nil {
		return fmt.Errorf("create the API socket directory: %w", err)
	}
	if err := noLink(); err != nil || created {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("the API socket directory %s is writable by every user (%v): anyone could put another socket in the API's place; choose a directory only the service's user may write to, such as the default <root-dir>/%s", dir, fi.Mode(), layout.APIDirName)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && gid >= 0 && int(st.Gid) != gid {
		log.Warn("the API socket directory was there already and is left as it is: members of --api-group may not reach the socket unless the directory lets them",
			"dir", dir, "dir_group", st.Gid, "api_group", gid, "mode", fi.Mode().Perm().String())
	}
	return nil
}
