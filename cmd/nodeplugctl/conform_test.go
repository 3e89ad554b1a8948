package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/nodeplug/nodeplug/internal/conform"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// TestConform runs nodeplugctl conform against nodeplug-sampleplugin,
// built once for its subtests.
func TestConform(t *testing.T) {
	dir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*testutil.Deadline)
	defer cancel()
	if err := stack.Build(ctx, dir, "nodeplug-sampleplugin"); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "nodeplug-sampleplugin")
	t.Run("SamplePlugin", func(t *testing.T) { testConformSamplePlugin(t, bin) })
	t.Run("SocketTable", func(t *testing.T) { testConformSocketTable(t, bin) })
	t.Run("FailExitCode", func(t *testing.T) { testConformFailExitCode(t, bin) })
}

func runCtl(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// make test runs conform against nodeplug-sampleplugin through both
// registration paths: no check fails or warns, and every check passes in
// one of them (a check that does not apply to one path is a skip there).
func testConformSamplePlugin(t *testing.T, bin string) {
	passed := map[string]bool{}
	for _, mode := range []string{"kubelet-sock", "plugins-registry"} {
		t.Run(mode, func(t *testing.T) {
			code, stdout, stderr := runCtl(t, "conform", "-o", "json", "--observe", "500ms", "--recreate-wait", "1s",
				"--", bin, "--mode", mode, "--preferred", "--prestart", "--cdi", "--log-level", "debug")
			var rep conform.Report
			if err := json.Unmarshal([]byte(stdout), &rep); err != nil {
				t.Fatalf("exit %d, %v\nstdout:\n%s\nstderr:\n%s", code, err, stdout, stderr)
			}
			for _, res := range rep.Results {
				switch res.Status {
				case conform.Pass:
					passed[res.Name] = true
				case conform.Fail, conform.Warn:
					t.Errorf("%s: %s: %s", res.Name, res.Status, res.Detail)
				}
			}
			if code != exitOK {
				t.Errorf("exit code %d; stderr: %s", code, stderr)
			}
			if t.Failed() {
				t.Logf("plugin output:\n%s", rep.PluginOutput)
			}
		})
	}
	for _, c := range conform.Catalogue {
		// A device plugin has no CSI or DRA service: internal/conform's
		// tests run driver-service against CSI and DRA plugins.
		if !passed[c.Name] && c.Name != conform.CheckDriverService {
			t.Errorf("check %s passed in no mode", c.Name)
		}
	}
}

// conform --socket checks a plugin that already runs, and prints a table.
func testConformSocketTable(t *testing.T, bin string) {
	root := testutil.TempDir(t)
	cmd := exec.Command(bin, "--resource", "example.com/table")
	cmd.Env = append(os.Environ(), "NODEPLUG_ROOT_DIR="+root)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	sock := filepath.Join(root, "plugins_registry", "example-com_table.sock")
	testutil.WaitFor(t, "the sample plugin's socket", func() bool {
		_, err := os.Stat(sock)
		return err == nil
	})
	code, stdout, stderr := runCtl(t, "conform", "--socket", sock, "--observe", "200ms")
	if code != exitOK {
		t.Fatalf("exit %d\n%s\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"registers through: plugins_registry (example.com/table)", "CHECK", "allocate-concurrent", "PASS", "sigterm", "SKIP", "checks: "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table lacks %q:\n%s", want, stdout)
		}
	}
}

// A failed check makes the exit code non-zero, and the table says what the
// kubelet does.
func testConformFailExitCode(t *testing.T, bin string) {
	code, stdout, stderr := runCtl(t, "conform", "--only", "getinfo,notify", "--", bin, "--resource", "no-domain")
	if code != exitError {
		t.Fatalf("exit %d, want %d\n%s\n%s", code, exitError, stdout, stderr)
	}
	for _, want := range []string{"getinfo", "FAIL", "invalid", "what the kubelet does:", "operation_generator.go"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("output lacks %q:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "1 of 2 checks failed") {
		t.Errorf("stderr: %s", stderr)
	}
}

func TestConformUsage(t *testing.T) {
	for _, args := range [][]string{
		{"conform"},
		{"conform", "--socket", "/x.sock", "--", "true"},
		{"conform", "--only", "no-such-check", "--socket", "/x.sock"},
		{"conform", "-o", "yaml", "--socket", "/x.sock"},
	} {
		if code, _, stderr := runCtl(t, args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d: %s", args, code, exitUsage, stderr)
		}
	}
}
