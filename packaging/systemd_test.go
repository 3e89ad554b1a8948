package packaging_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// host is a Debian host booted with systemd as PID 1: a podman container
// of a root filesystem made from Debian's packages.
type host struct {
	t      *testing.T
	podman string
	env    []string
	name   string
}

// podmanConf is the podman configuration of the test's own storage: the
// default rlimits are refused on this kind of machine, the lock and event
// log are files (no systemd on the outside), cgroups through cgroupfs.
const podmanConf = `[containers]
default_ulimits = []

[engine]
tmp_dir = %q
lock_type = "file"
events_logger = "file"
cgroup_manager = "cgroupfs"
`

// bootHost makes a Debian bookworm root filesystem with systemd
// (mmdebstrap, from Debian's mirror), imports it into podman and boots it,
// waiting until systemd says the system is running. Where that cannot be
// done here, the test is skipped with the reason.
func bootHost(t *testing.T) *host {
	t.Helper()
	podman, err := exec.LookPath("podman")
	if err != nil {
		t.Skip("podman is not installed: no host with systemd as PID 1 can be booted here")
	}
	mmdebstrap, err := exec.LookPath("mmdebstrap")
	if err != nil {
		t.Skip("mmdebstrap is not installed (Debian's mmdebstrap package): no Debian root filesystem can be made here")
	}
	dir := testutil.TempDir(t)
	for _, d := range []string{"storage", "runroot", "tmp"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "containers.conf"), fmt.Sprintf(podmanConf, filepath.Join(dir, "tmp")))
	writeFile(t, filepath.Join(dir, "storage.conf"), fmt.Sprintf("[storage]\ndriver = \"vfs\"\ngraphroot = %q\nrunroot = %q\n",
		filepath.Join(dir, "storage"), filepath.Join(dir, "runroot")))
	h := &host{t: t, podman: podman, name: "nodeplug-systemd-test", env: []string{
		"CONTAINERS_CONF=" + filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF=" + filepath.Join(dir, "storage.conf"),
	}}

	tarball := filepath.Join(dir, "rootfs.tar")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	// Twice at most: the mirror is across the network.
	var out []byte
	for range 2 {
		out, err = exec.CommandContext(ctx, mmdebstrap, "--variant=apt", "--include=systemd,systemd-sysv,dbus,procps,passwd",
			"bookworm", tarball, "http://deb.debian.org/debian").CombinedOutput()
		if err == nil || ctx.Err() != nil {
			break
		}
		t.Logf("mmdebstrap failed, once more: %v\n%s", err, tail(out))
	}
	if err != nil {
		t.Fatalf("mmdebstrap (a Debian root filesystem with systemd, from deb.debian.org): %v\n%s", err, tail(out))
	}
	const image = "localhost/nodeplug-systemd-test:bookworm"
	if out, err := h.podmanCmd("import", tarball, image); err != nil {
		t.Skipf("podman cannot import an image here: %v\n%s", err, out)
	}
	if out, err := h.podmanCmd("run", "-d", "--name", h.name, "--systemd=always", "--pull=never", image, "/sbin/init"); err != nil {
		t.Skipf("podman cannot start a container with systemd as PID 1 here: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := h.exec("journalctl", "--no-pager", "-n", "200", "-u", "nodeplug-*")
			t.Logf("the host's journal of nodeplug:\n%s", out)
		}
		_, _ = h.podmanCmd("rm", "-f", "-t", "0", h.name)
	})
	var state string
	h.wait("systemd running as PID 1 in the container", func() error {
		out, _ := h.exec("systemctl", "is-system-running")
		state = strings.TrimSpace(out)
		switch state {
		case "running":
			return nil
		case "degraded":
			failed, _ := h.exec("systemctl", "--failed", "--no-legend")
			return permanent{fmt.Errorf("systemd is degraded: %s", failed)}
		}
		return fmt.Errorf("systemd is %q", state)
	})
	return h
}

// hostDeadline bounds a wait on the host: a boot, an apt install or a
// restart, on a busy 2-core machine.
const hostDeadline = 3 * time.Minute

// permanent is a condition's failure that waiting will not mend.
type permanent struct{ error }

// wait polls cond (each poll a podman exec or more) until it returns nil,
// failing the test with its last error after hostDeadline, or at once on
// a permanent one.
func (h *host) wait(what string, cond func() error) {
	h.t.Helper()
	deadline := time.Now().Add(hostDeadline)
	for {
		err := cond()
		if err == nil {
			return
		}
		var p permanent
		if errors.As(err, &p) {
			h.t.Fatalf("%s: %v", what, p.error)
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out after %s waiting for %s: %v", hostDeadline, what, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (h *host) podmanCmd(args ...string) (string, error) {
	cmd := exec.Command(h.podman, args...)
	cmd.Env = append(os.Environ(), h.env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// exec runs a command on the host, as root.
func (h *host) exec(args ...string) (string, error) {
	return h.podmanCmd(append([]string{"exec", h.name}, args...)...)
}

// must runs a command on the host and fails the test when it fails.
func (h *host) must(args ...string) string {
	h.t.Helper()
	out, err := h.exec(args...)
	if err != nil {
		h.t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// as runs a shell command on the host as user.
func (h *host) as(user, script string) (string, error) {
	return h.exec("su", user, "-s", "/bin/sh", "-c", script)
}

func (h *host) copy(src, dst string) {
	h.t.Helper()
	if out, err := h.podmanCmd("cp", src, h.name+":"+dst); err != nil {
		h.t.Fatalf("podman cp %s: %v\n%s", src, err, out)
	}
}

// show is one property of a unit.
func (h *host) show(unit, prop string) string {
	out, _ := h.exec("systemctl", "show", "-p", prop, "--value", unit)
	return strings.TrimSpace(out)
}

// waitActive waits until every unit is active.
func (h *host) waitActive(units ...string) {
	h.t.Helper()
	h.wait(strings.Join(units, ", ")+" active", func() error {
		out, err := h.exec(append([]string{"systemctl", "is-active"}, units...)...)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
}

// allocations is what nodeplugctl lists of pod's allocations.
func (h *host) allocations(pod string) string {
	out, err := h.exec("nodeplugctl", "allocations", "--pod", pod)
	if err != nil {
		return "error: " + err.Error() + ": " + out
	}
	return out
}

var units = []string{"nodeplug.target", "nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager", "nodeplug-dramanager", "nodeplug-apiserver"}

// TestOnSystemd installs the package with apt on a Debian host booted with
// systemd as PID 1, and runs it there: every unit active; a device plugin
// registers; an operator allocates with nodeplugctl and a reader may not;
// a kill -9 is restarted by systemd with the allocation kept; a service
// that hangs (SIGSTOP) is restarted by the watchdog; an upgrade to a
// package of a higher version keeps the allocation and the plugin's
// devices healthy, and the plugin is not registered again; purge leaves
// nothing of nodeplug behind.
func TestOnSystemd(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: boots a Debian host in podman")
	}
	v1, v2 := version1, version2
	deb1, deb2 := debPackage(t, v1), debPackage(t, v2)
	plugins := testutil.TempDir(t)
	if err := stack.Build(context.Background(), plugins, "nodeplug-sampleplugin"); err != nil {
		t.Fatal(err)
	}
	h := bootHost(t)

	// Install: apt, and the target and its services come up.
	h.copy(deb1, "/tmp/nodeplug-1.deb")
	h.copy(deb2, "/tmp/nodeplug-2.deb")
	h.must("apt-get", "install", "-y", "--no-install-recommends", "/tmp/nodeplug-1.deb")
	h.waitActive(units...)
	if got := h.show("nodeplug-devicemanager", "StatusText"); got != "serving on /var/lib/kubelet/nodeplug/devicemanager.sock" {
		t.Errorf("the devicemanager's status: %q", got)
	}
	if out := h.must("nodeplug-watcher", "--version"); !strings.Contains(out, v1) {
		t.Errorf("nodeplug-watcher --version = %q, want %s", out, v1)
	}

	// A device plugin, and callers in the package's groups.
	h.copy(filepath.Join(plugins, "nodeplug-sampleplugin"), "/usr/local/bin/nodeplug-sampleplugin")
	// Its log says "registered" at each NotifyRegistrationStatus(true):
	// the plugin's own count of its registrations.
	if out, err := h.podmanCmd("exec", "-d", h.name, "sh", "-c", "exec nodeplug-sampleplugin --devices 2 2>>/var/log/sampleplugin.log"); err != nil {
		t.Fatalf("starting the sample plugin: %v\n%s", err, out)
	}
	h.must("useradd", "-m", "-G", "nodeplug,nodeplug-ops", "ops")
	h.must("useradd", "-m", "-G", "nodeplug", "reader")
	h.wait("the sample plugin's 2 devices, as the reader sees them", func() error {
		out, err := h.as("reader", "nodeplugctl resources")
		if err != nil || !strings.Contains(out, "example.com/sample") || !strings.Contains(out, "live via plugins_registry") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if out, err := h.as("reader", "nodeplugctl allocate --pod pod-r --container c example.com/sample=1"); err == nil || !strings.Contains(out, "needs the operator role") {
		t.Fatalf("a reader's Allocate: %v, %s; want it refused for the operator role", err, out)
	}
	if out, err := h.as("ops", "nodeplugctl allocate --pod pod-1 --container c example.com/sample=1"); err != nil {
		t.Fatalf("the operator's Allocate: %v\n%s", err, out)
	}
	allocated := h.allocations("pod-1")
	if !strings.Contains(allocated, "example.com/sample") {
		t.Fatalf("allocations of pod-1: %s", allocated)
	}
	if n := h.registrations(); n != 1 {
		t.Fatalf("the sample plugin was told it is registered %d times, want once", n)
	}

	// kill -9: systemd starts the devicemanager again, which keeps the
	// allocation.
	pid := h.show("nodeplug-devicemanager", "MainPID")
	h.must("kill", "-9", pid)
	h.wait("the devicemanager restarted by systemd", func() error {
		if n, p := h.show("nodeplug-devicemanager", "NRestarts"), h.show("nodeplug-devicemanager", "MainPID"); n != "1" || p == pid || p == "0" {
			return fmt.Errorf("NRestarts=%s MainPID=%s (was %s)", n, p, pid)
		}
		return nil
	})
	h.waitActive("nodeplug-devicemanager")
	h.wait("pod-1's allocation after the restart", func() error {
		if got := h.allocations("pod-1"); !strings.Contains(got, "example.com/sample") {
			return errors.New(got)
		}
		return nil
	})

	// A service that hangs: the watchdog (3 s here, by a drop-in) sees no
	// pet and systemd restarts it.
	h.must("sh", "-c", "mkdir -p /run/systemd/system/nodeplug-watcher.service.d && "+
		"printf '[Service]\\nWatchdogSec=3s\\nTimeoutAbortSec=2s\\n' > /run/systemd/system/nodeplug-watcher.service.d/watchdog.conf && "+
		"systemctl daemon-reload && systemctl restart nodeplug-watcher")
	h.waitActive("nodeplug-watcher")
	pid = h.show("nodeplug-watcher", "MainPID")
	h.must("kill", "-STOP", pid)
	h.wait("the hung watcher restarted by its watchdog", func() error {
		if p := h.show("nodeplug-watcher", "MainPID"); p == pid || p == "0" {
			return fmt.Errorf("MainPID %s", p)
		}
		return nil
	})
	h.waitActive("nodeplug-watcher")
	if out := h.must("journalctl", "--no-pager", "-u", "nodeplug-watcher"); !strings.Contains(out, "Failed with result 'watchdog'") {
		t.Errorf("the journal does not say the watchdog restarted the watcher:\n%s", tail([]byte(out)))
	}

	// Upgrade: a package of a higher version from the same tree.
	h.must("apt-get", "install", "-y", "--no-install-recommends", "/tmp/nodeplug-2.deb")
	h.waitActive(units...)
	if out := h.must("nodeplug-devicemanager", "--version"); !strings.Contains(out, v2) {
		t.Errorf("after the upgrade nodeplug-devicemanager --version = %q, want %s", out, v2)
	}
	h.wait("pod-1's allocation and healthy devices after the upgrade", func() error {
		if got := h.allocations("pod-1"); !strings.Contains(got, "example.com/sample") {
			return errors.New(got)
		}
		out, err := h.exec("nodeplugctl", "resources")
		if err != nil || !strings.Contains(out, "example.com/sample") || strings.Contains(out, "unhealthy") || !strings.Contains(out, "live via plugins_registry") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	// Every service restarted, the reconciler among them, and the plugin
	// was not registered again: the reconciler adopted its registration.
	if n := h.registrations(); n != 1 {
		t.Errorf("after the upgrade the sample plugin was told it is registered %d times, want once", n)
	}
	// The devicemanager redialled the plugin's endpoint from its
	// checkpoint before serving: its devices never went unhealthy.
	if out := h.must("journalctl", "--no-pager", "-u", "nodeplug-devicemanager"); strings.Contains(out, "recorded endpoint does not answer") {
		t.Errorf("a restarted devicemanager could not redial the plugin, whose devices were unhealthy meanwhile:\n%s", tail([]byte(out)))
	}
	if out := h.must("journalctl", "--no-pager", "-u", "nodeplug-reconciler"); !strings.Contains(out, "registrations recovered from the last run") {
		t.Errorf("the reconciler's journal does not say it recovered its registrations:\n%s", tail([]byte(out)))
	}

	// Purge: nothing of nodeplug remains.
	h.must("apt-get", "purge", "-y", "nodeplug")
	for _, p := range []string{"/etc/nodeplug", "/var/lib/kubelet/nodeplug", "/var/lib/kubelet/dra-manager",
		"/usr/bin/nodeplug-devicemanager", "/usr/bin/nodeplugctl", "/usr/lib/systemd/system/nodeplug.target",
		"/etc/systemd/system/nodeplug.target.wants", "/etc/systemd/system/multi-user.target.wants/nodeplug.target"} {
		if out, err := h.exec("test", "!", "-e", p); err != nil {
			t.Errorf("%s is left after purge: %v %s", p, err, out)
		}
	}
	if out, err := h.exec("sh", "-c", "ls /var/lib/kubelet/device-plugins/nodeplug_checkpoint* /var/lib/kubelet/nodeplug-*.lock 2>/dev/null"); err == nil && strings.TrimSpace(out) != "" {
		t.Errorf("nodeplug's checkpoint or locks are left after purge: %s", out)
	}
	if out, _ := h.exec("pgrep", "-f", "nodeplug-(watcher|reconciler|devicemanager|dramanager|apiserver)"); strings.TrimSpace(out) != "" {
		t.Errorf("nodeplug processes run after purge: %s", out)
	}
}

// registrations is how many times the sample plugin was told it is
// registered (NotifyRegistrationStatus(true)), from its log.
func (h *host) registrations() int {
	h.t.Helper()
	out := h.must("cat", "/var/log/sampleplugin.log")
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "msg=registered ") || strings.Contains(line, `"msg":"registered"`) {
			n++
		}
	}
	return n
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

// tail is the end of a command's output, for a failure's message.
func tail(out []byte) string {
	const max = 4000
	if len(out) > max {
		return "…" + string(out[len(out)-max:])
	}
	return string(out)
}
