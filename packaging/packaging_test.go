// Package packaging_test checks nodeplug's Debian package and its systemd
// units (packaging/, make package): the units as systemd-analyze reads
// them, the configuration files' variables against the services' own, and
// the package nfpm builds.
package packaging_test

import (
	"bufio"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// built is what this package's tests build once and share: the services'
// binaries, and each version of the package (package.sh links six
// binaries every time). TestMain removes it.
var built struct {
	mu   sync.Mutex
	dir  string
	bin  string
	debs map[string]string // by version and architecture
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// builtDirLocked is the directory of what the tests build once.
func builtDirLocked(t *testing.T) string {
	t.Helper()
	if built.dir == "" {
		dir, err := os.MkdirTemp("", "nodeplug-packaging")
		if err != nil {
			t.Fatal(err)
		}
		built.dir, built.debs = dir, map[string]string{}
	}
	return built.dir
}

// binaries are the services and nodeplugctl, built once.
func binaries(t *testing.T) string {
	t.Helper()
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.bin != "" {
		return built.bin
	}
	dir := filepath.Join(builtDirLocked(t), "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	names := []string{"nodeplugctl"}
	for _, s := range stack.Services {
		names = append(names, "nodeplug-"+s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if err := stack.Build(ctx, dir, names...); err != nil {
		t.Fatal(err)
	}
	built.bin = dir
	return dir
}

// Versions of the package the tests build: TestPackage reads the first
// back, TestOnSystemd installs it and upgrades to the second.
const (
	version1 = "1.0.0+test.1"
	version2 = "1.0.0+test.2"
)

// debPackage is the amd64 package of version, built once as make package
// builds it (scripts/package.sh with nfpm), or the test is skipped
// without nfpm.
func debPackage(t *testing.T, version string) string { return debPackageFor(t, version, "amd64") }

// debPackageFor is debPackage for the architecture arch.
func debPackageFor(t *testing.T, version, arch string) string {
	t.Helper()
	nfpm := nfpmPath(t)
	built.mu.Lock()
	defer built.mu.Unlock()
	key := version + "_" + arch
	dist := filepath.Join(builtDirLocked(t), "dist-"+key)
	if deb, ok := built.debs[key]; ok {
		return deb
	}
	root, err := stack.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "package.sh"), nfpm, version, arch)
	cmd.Env = append(os.Environ(), "NODEPLUG_DIST_DIR="+dist)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("package.sh %s %s: %v\n%s", version, arch, err, tail(out))
	}
	deb := filepath.Join(dist, "nodeplug_"+version+"_"+arch+".deb")
	built.debs[key] = deb
	return deb
}

// TestUnitsVerify: systemd-analyze verify reads nodeplug.target and every
// service's unit without a word: no unknown key, no bad value, each
// ExecStart an executable (the units are checked with ExecStart pointing
// at the binaries built here instead of /usr/bin).
func TestUnitsVerify(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian's systemd package): the units cannot be verified")
	}
	bin := binaries(t)
	dir := testutil.TempDir(t)
	units := []string{filepath.Join(dir, "nodeplug.target")}
	if err := copyFile(filepath.Join("systemd", "nodeplug.target"), units[0], nil); err != nil {
		t.Fatal(err)
	}
	for _, s := range stack.Services {
		name := "nodeplug-" + s + ".service"
		dst := filepath.Join(dir, name)
		err := copyFile(filepath.Join("systemd", name), dst, func(line string) string {
			if v, ok := strings.CutPrefix(line, "ExecStart=/usr/bin/"); ok {
				return "ExecStart=" + filepath.Join(bin, v)
			}
			return line
		})
		if err != nil {
			t.Fatal(err)
		}
		units = append(units, dst)
	}
	out, err := exec.Command(analyze, append([]string{"verify"}, units...)...).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}

	// What the target pulls in is every service, and each service is
	// installed into the target, started after the services it calls.
	target := readUnit(t, "nodeplug.target")
	for _, s := range stack.Services {
		u := readUnit(t, "nodeplug-"+s+".service")
		if !slices.Contains(target["Wants"], "nodeplug-"+s+".service") {
			t.Errorf("nodeplug.target does not want nodeplug-%s.service", s)
		}
		if got := u["WantedBy"]; !slices.Equal(got, []string{"nodeplug.target"}) {
			t.Errorf("nodeplug-%s.service WantedBy=%v, want nodeplug.target", s, got)
		}
		if got := u["Type"]; !slices.Equal(got, []string{"notify"}) {
			t.Errorf("nodeplug-%s.service Type=%v, want notify", s, got)
		}
		if len(u["WatchdogSec"]) != 1 || !slices.Equal(u["Restart"], []string{"always"}) {
			t.Errorf("nodeplug-%s.service WatchdogSec=%v Restart=%v, want a watchdog and Restart=always", s, u["WatchdogSec"], u["Restart"])
		}
	}
	after := readUnit(t, "nodeplug-reconciler.service")["After"]
	for _, peer := range []string{"watcher", "devicemanager", "dramanager"} {
		if !slices.Contains(after, "nodeplug-"+peer+".service") {
			t.Errorf("the reconciler starts after %v, not after nodeplug-%s.service, which it registers plugins with", after, peer)
		}
	}
}

// TestConfigNamesTheServicesVariables: every variable the files in
// /etc/nodeplug set or show commented out is one the service reads, as its
// own -h lists it, so a setting uncommented there takes effect.
func TestConfigNamesTheServicesVariables(t *testing.T) {
	bin := binaries(t)
	help := map[string]string{}
	for _, s := range stack.Services {
		out, _ := exec.Command(filepath.Join(bin, "nodeplug-"+s), "-h").CombinedOutput()
		if !strings.Contains(string(out), "NODEPLUG_ROOT_DIR") {
			t.Fatalf("nodeplug-%s -h lists no variables:\n%s", s, out)
		}
		help[s] = string(out)
	}
	setting := regexp.MustCompile(`^#?(NODEPLUG_[A-Z0-9_]+)=`)
	files := append([]string{"nodeplug"}, stack.Services...)
	for _, f := range files {
		vars, err := variables(filepath.Join("etc", f+".env"), setting)
		if err != nil {
			t.Fatal(err)
		}
		if len(vars) == 0 {
			t.Errorf("etc/%s.env names no variable", f)
		}
		readers := []string{f}
		if f == "nodeplug" {
			readers = stack.Services // read by every service
		}
		for _, v := range vars {
			for _, s := range readers {
				if !strings.Contains(help[s], v) {
					t.Errorf("etc/%s.env names %s, which nodeplug-%s does not read", f, v, s)
				}
			}
		}
	}
}

// TestPackage builds the Debian packages as make package does, for amd64
// and arm64, and reads them back with dpkg-deb: their version and
// architecture, their files, the configuration as conffiles, the
// maintainer scripts, and binaries built for the package's architecture
// that say the package's version (run for amd64, read as ELF for arm64).
func TestPackage(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the package build links six binaries per architecture")
	}
	dpkgDeb, err := exec.LookPath("dpkg-deb")
	if err != nil {
		t.Skip("dpkg-deb is not installed")
	}
	const version = version1
	for _, arch := range []string{"amd64", "arm64"} {
		t.Run(arch, func(t *testing.T) {
			deb := debPackageFor(t, version, arch)
			tree := readPackage(t, dpkgDeb, deb, version, arch)
			machine := map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch]
			for _, b := range []string{"nodeplugctl", "nodeplug-watcher", "nodeplug-reconciler", "nodeplug-devicemanager", "nodeplug-dramanager", "nodeplug-apiserver"} {
				path := filepath.Join(tree, "usr", "bin", b)
				f, err := elf.Open(path)
				if err != nil {
					t.Errorf("%s: %v", b, err)
					continue
				}
				if f.Machine != machine {
					t.Errorf("%s is built for %v, want %v", b, f.Machine, machine)
				}
				_ = f.Close()
				if arch != runtime.GOARCH {
					continue
				}
				out, err := exec.Command(path, "--version").CombinedOutput()
				if err != nil || !strings.Contains(string(out), version) {
					t.Errorf("%s --version: %v, %q: the package's version %s is not in it", b, err, out, version)
				}
			}
		})
	}
}

// readPackage checks the package deb's control fields and files, and
// returns the directory it was unpacked into.
func readPackage(t *testing.T, dpkgDeb, deb, version, arch string) string {
	t.Helper()
	field := func(name string) string {
		out, err := exec.Command(dpkgDeb, "-f", deb, name).CombinedOutput()
		if err != nil {
			t.Fatalf("dpkg-deb -f %s: %v\n%s", name, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if v, a, p := field("Version"), field("Architecture"), field("Package"); v != version || a != arch || p != "nodeplug" {
		t.Fatalf("package %s %s %s, want nodeplug %s %s", p, v, a, version, arch)
	}

	tree := testutil.TempDir(t)
	if out, err := exec.Command(dpkgDeb, "-R", deb, tree).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -R: %v\n%s", err, out)
	}
	want := []string{
		"usr/bin/nodeplugctl", "usr/share/man/man1/nodeplugctl.1.gz", "usr/share/bash-completion/completions/nodeplugctl", "usr/lib/systemd/system/nodeplug.target",
		"usr/lib/sysusers.d/nodeplug.conf", "usr/lib/tmpfiles.d/nodeplug.conf",
		"etc/nodeplug/nodeplug.env", "DEBIAN/postinst", "DEBIAN/prerm", "DEBIAN/postrm",
	}
	var conffiles []string
	for _, s := range stack.Services {
		want = append(want, "usr/bin/nodeplug-"+s, "usr/share/man/man8/nodeplug-"+s+".8.gz",
			"usr/lib/systemd/system/nodeplug-"+s+".service", "etc/nodeplug/"+s+".env")
		conffiles = append(conffiles, "/etc/nodeplug/"+s+".env")
	}
	for _, f := range want {
		if _, err := os.Stat(filepath.Join(tree, f)); err != nil {
			t.Errorf("the package lacks /%s: %v", f, err)
		}
	}
	cf, err := os.ReadFile(filepath.Join(tree, "DEBIAN", "conffiles"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(conffiles, "/etc/nodeplug/nodeplug.env") {
		if !slices.Contains(strings.Fields(string(cf)), c) {
			t.Errorf("%s is not a conffile: conffiles\n%s", c, cf)
		}
	}
	return tree
}

// nfpmPath is the nfpm make tools builds (NODEPLUG_NFPM names another);
// without one the test is skipped.
func nfpmPath(t *testing.T) string {
	t.Helper()
	nfpm := os.Getenv("NODEPLUG_NFPM")
	if nfpm == "" {
		home, _ := os.UserHomeDir()
		nfpm = filepath.Join(home, ".cache", "nodeplug", "tools", "nfpm-v2.48.0")
	}
	if _, err := os.Stat(nfpm); err != nil {
		t.Skipf("no nfpm at %s (make tools builds it; NODEPLUG_NFPM names another): %v", nfpm, err)
	}
	return nfpm
}

func copyFile(src, dst string, edit func(string) string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	lines := strings.Split(string(b), "\n")
	if edit != nil {
		for i, l := range lines {
			lines[i] = edit(l)
		}
	}
	return os.WriteFile(dst, []byte(strings.Join(lines, "\n")), 0o644)
}

// readUnit reads the settings of a unit in systemd/: each key's
// space-separated values, over all its lines.
func readUnit(t *testing.T, name string) map[string][]string {
	t.Helper()
	f, err := os.Open(filepath.Join("systemd", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if !ok || strings.HasPrefix(k, "#") || strings.HasPrefix(k, "[") {
			continue
		}
		u[k] = append(u[k], strings.Fields(v)...)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// variables lists the variables a configuration file sets or shows
// commented out.
func variables(path string, setting *regexp.Regexp) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var vars []string
	for l := range strings.Lines(string(b)) {
		if m := setting.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			vars = append(vars, m[1])
		}
	}
	return vars, nil
}
