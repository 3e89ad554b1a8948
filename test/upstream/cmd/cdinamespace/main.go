// Command cdinamespace runs a container runtime that reads CDI specs only
// from the directories it is given, without touching the host's.
//
// podman 4.3.1 (Debian bookworm's) resolves CDI device names in /etc/cdi
// and /var/run/cdi alone: it ignores containers.conf's cdi_spec_dirs (added
// to containers/common in 2024; later podman releases take a
// --cdi-spec-dir). So cdinamespace, started in a mount namespace
// of its own (the caller's exec.Cmd sets SysProcAttr.Unshareflags to
// CLONE_NEWNS; cdinamespace refuses to run in its parent's), makes in that
// namespace alone:
//   - a tmpfs on the -scratch directory;
//   - an overlay on /run (what /var/run names) with the host's /run as its
//     lower layer and its upper layer in the scratch tmpfs, so that
//     /run/cdi can be made and whatever the runtime writes under /run
//     stays in the namespace;
//   - /run/runc, runc's state, bound from the host's, so that podman
//     commands in other namespaces find the containers it started;
//   - /run/cdi: the -dir directory bound read-only, or with several, a
//     read-only overlay of them (a later -dir's file wins, as in CDI's
//     order);
//   - an empty read-only tmpfs on /etc/cdi when the host has one;
//
// and then executes the command after "--". The mounts end with the
// namespace, when the command's last process exits.
//
//	cdinamespace -scratch DIR -dir SPECDIR [-dir SPECDIR]... -- COMMAND [ARG]...
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

type dirs []string

func (d *dirs) String() string     { return strings.Join(*d, ",") }
func (d *dirs) Set(v string) error { *d = append(*d, v); return nil }

func main() {
	var specDirs dirs
	fs := flag.NewFlagSet("cdinamespace", flag.ExitOnError)
	scratch := fs.String("scratch", "", "an empty directory for the namespace's tmpfs")
	fs.Var(&specDirs, "dir", "a CDI spec directory (repeatable)")
	_ = fs.Parse(os.Args[1:])
	if *scratch == "" || len(specDirs) == 0 || fs.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: cdinamespace -scratch DIR -dir SPECDIR [-dir SPECDIR]... -- COMMAND [ARG]...")
		os.Exit(2)
	}
	if err := run(*scratch, specDirs, fs.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "cdinamespace:", err)
		os.Exit(125)
	}
}

func run(scratch string, specDirs, command []string) error {
	if err := ownNamespace(); err != nil {
		return err
	}
	// Nothing done here reaches the host's mounts (Go's exec already made
	// them private when it unshared the namespace; again, to be sure).
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	for _, d := range append([]string{scratch}, specDirs...) {
		if !filepath.IsAbs(d) || strings.ContainsAny(d, ",:") {
			return fmt.Errorf("%q: want an absolute path without ',' or ':'", d)
		}
	}
	if err := syscall.Mount("cdinamespace", scratch, "tmpfs", 0, "mode=0700"); err != nil {
		return fmt.Errorf("tmpfs on %s: %w", scratch, err)
	}
	upper, work := filepath.Join(scratch, "upper"), filepath.Join(scratch, "work")
	for _, d := range []string{upper, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	runDir, err := filepath.EvalSymlinks("/var/run")
	if err != nil {
		return err
	}
	// runc's state (/run/runc) stays the host's, through the overlay: a
	// container started under one namespace is then stopped and removed
	// from another (in an overlay's upper layer of its own, runc would not
	// find it, and podman would remove it with its processes running).
	runcDir, keep := filepath.Join(runDir, "runc"), filepath.Join(scratch, "runc")
	for _, d := range []string{runcDir, keep} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if err := syscall.Mount(runcDir, keep, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", runcDir, keep, err)
	}
	if err := syscall.Mount("overlay", runDir, "overlay", 0,
		fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", runDir, upper, work)); err != nil {
		return fmt.Errorf("overlay on %s: %w", runDir, err)
	}
	if err := syscall.Mount(keep, runcDir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on %s: %w", keep, runcDir, err)
	}
	cdiDir := filepath.Join(runDir, "cdi")
	if err := os.MkdirAll(cdiDir, 0o755); err != nil {
		return err
	}
	if err := mountSpecDirs(cdiDir, specDirs); err != nil {
		return err
	}
	if fi, err := os.Stat("/etc/cdi"); err == nil && fi.IsDir() {
		if err := syscall.Mount("cdinamespace", "/etc/cdi", "tmpfs", syscall.MS_RDONLY, "mode=0755"); err != nil {
			return fmt.Errorf("empty /etc/cdi: %w", err)
		}
	}
	bin, err := exec.LookPath(command[0])
	if err != nil {
		return err
	}
	return syscall.Exec(bin, command, os.Environ())
}

// ownNamespace checks that this process's mount namespace is not its
// parent's.
func ownNamespace() error {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", os.Getppid()))
	if err != nil {
		return err
	}
	if self == parent {
		return errors.New("not in a mount namespace of its own (start it with SysProcAttr.Unshareflags = CLONE_NEWNS)")
	}
	return nil
}

// mountSpecDirs makes target show the spec directories, read-only.
func mountSpecDirs(target string, specDirs []string) error {
	if len(specDirs) == 1 {
		if err := syscall.Mount(specDirs[0], target, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind %s on %s: %w", specDirs[0], target, err)
		}
		if err := syscall.Mount("", target, "", syscall.MS_BIND|syscall.MS_REMOUNT|syscall.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("remount %s read-only: %w", target, err)
		}
		return nil
	}
	// An overlay's first lower layer is its top one.
	lower := slices.Clone(specDirs)
	slices.Reverse(lower)
	if err := syscall.Mount("overlay", target, "overlay", syscall.MS_RDONLY, "lowerdir="+strings.Join(lower, ":")); err != nil {
		return fmt.Errorf("overlay of %v on %s: %w", specDirs, target, err)
	}
	return nil
}
