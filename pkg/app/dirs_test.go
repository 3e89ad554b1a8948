package app

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/lockfile"
)

// start runs a service with cfg until it serves (a stop that waits for it
// to end, and nil) or fails to start (its error).
func start(t *testing.T, cfg Config) (func(), error) {
	t.Helper()
	cfg.LogLevel, cfg.LogFormat = "info", "text"
	if cfg.Binary == "" {
		cfg.Binary = "test"
	}
	ready := make(chan struct{})
	svc := Service{Binary: cfg.Binary, Setup: func(context.Context, *Runtime) error { close(ready); return nil }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, svc, cfg, slog.New(slog.DiscardHandler)) }()
	select {
	case err := <-done:
		cancel()
		return func() {}, err
	case <-ready:
		stop := sync.OnceFunc(func() {
			cancel()
			select {
			case err := <-done:
				t.Logf("Run stopped: %v", err)
			case <-time.After(30 * time.Second):
				t.Error("Run did not stop")
			}
		})
		t.Cleanup(stop)
		return stop, nil
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("Run neither served nor failed")
		return nil, nil
	}
}

// modeAndGroup returns the permission bits (with sticky) and group of p.
func modeAndGroup(t *testing.T, p string) (fs.FileMode, uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode() & (fs.ModePerm | fs.ModeSticky), fi.Sys().(*syscall.Stat_t).Gid
}

// TestAPIDirSymlinkRefused: a symbolic link planted at <root>/nodeplug is
// refused at start with an error that says so; the directory it points to
// keeps its mode and gets no socket.
func TestAPIDirSymlinkRefused(t *testing.T) {
	root := testutil.TempDir(t)
	target := testutil.TempDir(t)
	if err := os.Chmod(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, layout.APIDir(root)); err != nil {
		t.Fatal(err)
	}
	stop, err := start(t, Config{RootDir: root, APISocket: layout.APISocket(root, "test")})
	stop()
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("start with a link at %s: %v; want it refused as a symbolic link", layout.APIDir(root), err)
	}
	if mode, _ := modeAndGroup(t, target); mode != 0o755 {
		t.Errorf("the link's target is now %v, want 0755 as it was", mode)
	}
	if entries, _ := os.ReadDir(target); len(entries) != 0 {
		t.Errorf("the link's target holds %v, want nothing", entries)
	}
}

// TestWorldWritableAPIDirRefused: an API socket in a directory anyone may
// write to (as /tmp) is refused at start with an error that says so, and
// the directory keeps its mode.
func TestWorldWritableAPIDirRefused(t *testing.T) {
	root := testutil.TempDir(t)
	shared := testutil.TempDir(t)
	if err := os.Chmod(shared, 0o777|fs.ModeSticky); err != nil {
		t.Fatal(err)
	}
	stop, err := start(t, Config{RootDir: root, APISocket: filepath.Join(shared, "x.sock")})
	stop()
	if err == nil || !strings.Contains(err.Error(), "writable by every user") {
		t.Fatalf("start with the API socket in a world-writable directory: %v; want it refused", err)
	}
	if mode, _ := modeAndGroup(t, shared); mode != 0o777|fs.ModeSticky {
		t.Errorf("the directory is now %v, want 1777 as it was", mode)
	}
}

// TestExistingAPIDirLeftAlone: a directory given as the API socket's that
// was there before keeps its mode and group; the socket is 0660 of the
// API group all the same. The default <root>/nodeplug, which the service
// creates, is 0750 of the API group.
func TestExistingAPIDirLeftAlone(t *testing.T) {
	gid := os.Getgid()
	if os.Getuid() == 0 {
		gid = 4346 // any group: root may give a file any
	}
	group := strconv.Itoa(gid)
	root := testutil.TempDir(t)
	mine := testutil.TempDir(t)
	if err := os.Chmod(mine, 0o755); err != nil {
		t.Fatal(err)
	}
	_, wasGroup := modeAndGroup(t, mine)
	sock := filepath.Join(mine, "x.sock")
	if _, err := start(t, Config{RootDir: root, APISocket: sock, APIGroup: group}); err != nil {
		t.Fatal(err)
	}
	if mode, g := modeAndGroup(t, mine); mode != 0o755 || g != wasGroup {
		t.Errorf("the existing directory is now %v of group %d, want 0755 of %d as it was", mode, g, wasGroup)
	}
	if mode, g := modeAndGroup(t, sock); mode != 0o660 || g != uint32(gid) {
		t.Errorf("the API socket is %v of group %d, want 0660 of %d", mode, g, gid)
	}

	root2 := testutil.TempDir(t)
	if _, err := start(t, Config{Binary: "other", RootDir: root2, APISocket: layout.APISocket(root2, "other"), APIGroup: group}); err != nil {
		t.Fatal(err)
	}
	if mode, g := modeAndGroup(t, layout.APIDir(root2)); mode != 0o750 || g != uint32(gid) {
		t.Errorf("the API socket directory the service created is %v of group %d, want 0750 of %d", mode, g, gid)
	}
}

// TestCreatedRootDirLetsAPIGroupThrough: a root dir the service creates
// (and the missing directories above it) lets the members of --api-group
// through to the API socket, and nobody else: 0710 of that group. Checked
// from processes of another user, in the group and not.
func TestCreatedRootDirLetsAPIGroupThrough(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("giving a directory another group and calling as another user needs root")
	}
	const apiGID, nobody = 4345, 65534
	parent := testutil.TempDir(t)
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(parent, "var", "root")
	sock := layout.APISocket(root, "test")
	if _, err := start(t, Config{RootDir: root, APISocket: sock, APIGroup: strconv.Itoa(apiGID)}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{filepath.Dir(root), root} {
		if mode, g := modeAndGroup(t, d); mode != 0o710 || g != apiGID {
			t.Errorf("created %s: %v of group %d, want 0710 of --api-group %d", d, mode, g, apiGID)
		}
	}
	reaches := func(gid uint32) error {
		cmd := exec.Command("/bin/sh", "-c", `test -S "$0"`, sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: gid}}
		return cmd.Run()
	}
	if err := reaches(apiGID); err != nil {
		t.Errorf("a member of --api-group cannot reach %s: %v", sock, err)
	}
	var exit *exec.ExitError
	if err := reaches(nobody); !errors.As(err, &exit) {
		t.Errorf("a user outside --api-group reaches %s (%v)", sock, err)
	}
}

// TestLockRefusalNamesTheReason: a lock file that cannot be taken for
// another reason than its holder (a symbolic link, a directory) is refused
// with that reason, not as another instance running; one held by another
// instance says so.
func TestLockRefusalNamesTheReason(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(path string) error
		why   string
	}{
		{"symbolic link", func(p string) error { return os.Symlink(os.DevNull, p) }, "symbolic link"},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }, "is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := testutil.TempDir(t)
			if err := tc.plant(layout.LockFile(root, "test")); err != nil {
				t.Fatal(err)
			}
			stop, err := start(t, Config{RootDir: root, APISocket: layout.APISocket(root, "test")})
			stop()
			if err == nil || !strings.Contains(err.Error(), tc.why) || strings.Contains(err.Error(), "another") || errors.Is(err, lockfile.ErrLocked) {
				t.Fatalf("start with a %s as the lock file: %v; want it refused for that, not as another instance", tc.name, err)
			}
		})
	}
	t.Run("held", func(t *testing.T) {
		root := testutil.TempDir(t)
		l, err := lockfile.Acquire(layout.LockFile(root, "test"))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Release() }()
		stop, err := start(t, Config{RootDir: root, APISocket: layout.APISocket(root, "test")})
		stop()
		if !errors.Is(err, lockfile.ErrLocked) || !strings.Contains(err.Error(), "another nodeplug-test runs") {
			t.Fatalf("start with the lock held: %v; want another instance named", err)
		}
	})
}
