// Package containerstest gives tests a real podman over storage of their
// own, holding images of ctrcmd (a static test program, built once): the
// host's images and containers are not touched, and tests run in
// parallel (New). It gives them the host's docker engine too, with images
// of ctrcmd of their own and names unique to them (NewDocker). When the
// runtime is not installed, or cannot run a container here, the test is
// skipped with the reason.
package containerstest

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// The images New imports: both hold /ctrcmd (see ctrcmd's documentation
// for what it does) and an empty directory /srv.
const (
	// Image has ENTRYPOINT ["/ctrcmd", "from-entrypoint"] and
	// CMD ["from-cmd"].
	Image = "localhost/nodeplug-ctrcmd:test"
	// CmdImage has CMD ["/ctrcmd", "from-cmd"] and no ENTRYPOINT.
	CmdImage = "localhost/nodeplug-ctrcmd:cmd"
)

// Deadline bounds each podman command the package runs.
const Deadline = 3 * time.Minute

// Storage is podman storage of a test's own.
type Storage struct {
	t testing.TB
	// Dir holds the storage and podman's configuration.
	Dir string
	// Env points podman at them (CONTAINERS_CONF, CONTAINERS_STORAGE_CONF).
	Env []string
}

var program struct {
	once sync.Once
	path string
	err  error
}

// ctrcmd is the test program, built once (static).
func ctrcmd(t testing.TB) string {
	t.Helper()
	program.once.Do(func() {
		dir, err := os.MkdirTemp("", "ctrcmd")
		if err != nil {
			program.err = err
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		program.path = filepath.Join(dir, "ctrcmd")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", program.path, "github.com/nodeplug/nodeplug/internal/containerstest/ctrcmd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			program.err = fmt.Errorf("go build ctrcmd: %v\n%s", err, out)
		}
	})
	if program.err != nil {
		t.Fatal(program.err)
	}
	return program.path
}

// New makes podman storage for the test, imports Image and CmdImage into
// it and checks a container of Image runs; the test's containers are
// removed when it ends.
func New(t testing.TB) *Storage {
	t.Helper()
	if _, err := exec.LookPath("podman"); err != nil {
		t.Skipf("podman is not installed: %v", err)
	}
	bin := ctrcmd(t)
	dir := t.TempDir()
	s := &Storage{t: t, Dir: dir, Env: Configure(t, dir)}
	// Before the directory is removed: no container is left running over
	// it.
	t.Cleanup(func() {
		if _, err := s.podman("rm", "--all", "--force", "--time=0"); err != nil {
			t.Errorf("removing the test's containers: %v", err)
		}
	})
	tarball := filepath.Join(dir, "rootfs.tar")
	if err := RootfsTar(tarball, bin, "ctrcmd", "srv/"); err != nil {
		t.Fatal(err)
	}
	for image, changes := range map[string][]string{
		Image:    {`ENTRYPOINT ["/ctrcmd", "from-entrypoint"]`, `CMD ["from-cmd"]`},
		CmdImage: {`CMD ["/ctrcmd", "from-cmd"]`},
	} {
		args := []string{"import"}
		for _, c := range changes {
			args = append(args, "--change", c)
		}
		if _, err := s.podman(append(args, tarball, image)...); err != nil {
			t.Skipf("podman cannot import an image here: %v", err)
		}
	}
	if _, err := s.podman("run", "--rm", "--network=none", "--pull=never", Image); err != nil {
		t.Skipf("podman cannot run a container here: %v", err)
	}
	return s
}

// Configure makes podman storage and configuration in dir, and returns
// the environment that points podman at them. default_ulimits: podman's
// default rlimits are refused on this kind of machine. lock_type file: no
// lock segment shared with the host's podman in /dev/shm. cgroupfs and the
// file event log: no systemd.
func Configure(t testing.TB, dir string) []string {
	t.Helper()
	for _, d := range []string{"storage", "runroot", "tmp", "copytmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf(`[containers]
default_ulimits = []

[engine]
tmp_dir = %q
image_copy_tmp_dir = %q
lock_type = "file"
events_logger = "file"
cgroup_manager = "cgroupfs"
`, filepath.Join(dir, "tmp"), filepath.Join(dir, "copytmp"))
	storage := fmt.Sprintf("[storage]\ndriver = \"vfs\"\ngraphroot = %q\nrunroot = %q\n",
		filepath.Join(dir, "storage"), filepath.Join(dir, "runroot"))
	write(t, filepath.Join(dir, "containers.conf"), conf)
	write(t, filepath.Join(dir, "storage.conf"), storage)
	return []string{
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
	}
}

// Podman runs podman over the storage and returns its output; an error
// carries its stderr.
func (s *Storage) Podman(args ...string) []byte {
	s.t.Helper()
	out, err := s.podman(args...)
	if err != nil {
		s.t.Fatal(err)
	}
	return out
}

func (s *Storage) podman(args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), Deadline)
	defer cancel()
	cmd := exec.CommandContext(ctx, "podman", args...)
	cmd.Env = append(os.Environ(), s.Env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("podman %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// RootfsTar writes, as the tarball of an image's root file system, the
// directories dirs (each "name/") and the static program bin as /name,
// and nothing else.
func RootfsTar(tarball, bin, name string, dirs ...string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Name: d, Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
			return err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(data); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return os.WriteFile(tarball, buf.Bytes(), 0o600)
}

func write(t testing.TB, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
