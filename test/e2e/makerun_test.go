package e2e

import (
	"bufio"
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// readmeCommands returns the command lines of the README's "Looking inside"
// section that start with prefix ("bin/nodeplugctl" or "grpcurl"), with
// backslash continuations joined and trailing comments removed.
func readmeCommands(t *testing.T, root string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	inSection, inBlock := false, false
	pending := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			inSection = line == "## Looking inside"
			continue
		case strings.HasPrefix(line, "```"):
			inBlock = !inBlock
			continue
		}
		if !inSection || !inBlock {
			continue
		}
		line = pending + line
		pending = ""
		if strings.HasSuffix(line, "\\") {
			pending = strings.TrimSuffix(line, "\\")
			continue
		}
		if i := strings.Index(line, "  #"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "bin/nodeplugctl ") || strings.HasPrefix(line, "grpcurl ") {
			cmds = append(cmds, line)
		}
	}
	if len(cmds) < 8 {
		t.Fatalf("found only %d commands in the README's \"Looking inside\" section: %v", len(cmds), cmds)
	}
	return cmds
}

// TestMakeRun runs `make run` as a user would, waits until the stack is
// healthy and the sample plugin registered, runs the README's nodeplugctl
// and grpcurl lines as written, sends SIGINT (Ctrl-C), and checks that no
// process or socket is left behind.
func TestMakeRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every binary and runs the stack on the default ports")
	}
	root, err := stack.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	cmds := readmeCommands(t, root)
	runDir := testutil.TempDir(t)

	var out syncBuffer
	mk := exec.Command("make", "run")
	mk.Dir = root
	mk.Env = append(os.Environ(), "NODEPLUG_RUN_DIR="+runDir)
	mk.Stdout = &out
	mk.Stderr = &out
	mk.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := mk.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- mk.Wait() }()
	defer func() {
		_ = syscall.Kill(-mk.Process.Pid, syscall.SIGKILL)
	}()

	deadline := time.After(10 * time.Minute)
	for !strings.Contains(out.String(), "Press Ctrl-C to stop.") {
		select {
		case err := <-done:
			t.Fatalf("make run exited early (%v):\n%s", err, out.String())
		case <-deadline:
			t.Fatalf("make run did not get ready:\n%s", out.String())
		case <-time.After(200 * time.Millisecond):
		}
	}

	grpcurl := ""
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "-plaintext" && filepath.IsAbs(f[0]) {
			grpcurl = f[0]
			break
		}
	}
	if grpcurl == "" {
		t.Fatalf("make run did not print a grpcurl line:\n%s", out.String())
	}
	// make run prints the one export the README's commands need, and the
	// README shows it: run them with it.
	export := ""
	for _, line := range strings.Split(out.String(), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "export NODEPLUG_ROOT_DIR="); ok {
			export = v
		}
	}
	if export == "" {
		t.Fatalf("make run did not print the export NODEPLUG_ROOT_DIR=… line:\n%s", out.String())
	}
	if readme, _ := os.ReadFile(filepath.Join(root, "README.md")); !bytes.Contains(readme, []byte("export NODEPLUG_ROOT_DIR=")) {
		t.Error("the README does not show the export NODEPLUG_ROOT_DIR=… line")
	}
	// The README says `grpcurl`: put the pinned one on PATH under that name.
	pathDir := filepath.Join(runDir, "path")
	if err := os.MkdirAll(pathDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(grpcurl, filepath.Join(pathDir, "grpcurl")); err != nil {
		t.Fatal(err)
	}
	path := pathDir + string(os.PathListSeparator) + os.Getenv("PATH")

	for _, c := range cmds {
		if strings.Contains(c, "TRACE_ID") {
			continue // needs Jaeger: covered by the compose test
		}
		streaming := strings.Contains(c, " watch ") || strings.Contains(c, "Service/Watch")
		timeout := 30 * time.Second
		if streaming {
			timeout = 3 * time.Second
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		cmd := exec.CommandContext(ctx, "bash", "-c", c)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "PATH="+path, "NODEPLUG_ROOT_DIR="+export)
		got, err := cmd.CombinedOutput()
		cancel()
		if streaming {
			if len(bytes.TrimSpace(got)) == 0 {
				t.Errorf("%s printed nothing", c)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v\n%s", c, err, got)
		} else {
			t.Logf("$ %s\n%s", c, got)
		}
	}

	if err := syscall.Kill(-mk.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Logf("make run exited after SIGINT: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatalf("make run did not stop after SIGINT:\n%s", out.String())
	}
	if left := processesWithRoot(filepath.Join(runDir, "root")); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
	var sockets []string
	_ = filepath.Walk(runDir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode()&os.ModeSocket != 0 {
			sockets = append(sockets, p)
		}
		return nil
	})
	if len(sockets) > 0 {
		t.Errorf("sockets left behind: %v", sockets)
	}
	if t.Failed() {
		t.Logf("make run output:\n%s", out.String())
	}
}

// processesWithRoot lists the PIDs whose environment has NODEPLUG_ROOT_DIR=root.
func processesWithRoot(root string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	want := []byte("NODEPLUG_ROOT_DIR=" + root + "\x00")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil {
			continue
		}
		if bytes.Contains(env, want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRunScriptAsNonRoot runs the stack the way `make run` does, as the
// unprivileged user nobody: everything lives under the run dir, nothing
// needs root. It runs when the tests run as root (and can switch user).
func TestRunScriptAsNonRoot(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the stack on the default ports")
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: TestMakeRun already runs the stack as a non-root user")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv not found")
	}
	root, err := stack.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	asNobody := func(ctx context.Context, args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, setpriv, append([]string{"--reuid=65534", "--regid=65534", "--clear-groups"}, args...)...)
	}
	if err := asNobody(context.Background(), "test", "-x", filepath.Join(root, "scripts", "run.sh")).Run(); err != nil {
		t.Skipf("the checkout is not readable by nobody here (%v)", err)
	}
	runDir := testutil.TempDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := filepath.Walk(runDir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 65534, 65534)
	}); err != nil {
		t.Fatal(err)
	}

	var out syncBuffer
	cmd := asNobody(ctx, filepath.Join(root, "scripts", "run.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HOME="+runDir, "NODEPLUG_RUN_DIR="+runDir, "BIN="+binDir)
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }()
	for !strings.Contains(out.String(), "Press Ctrl-C to stop.") {
		select {
		case err := <-done:
			t.Fatalf("run.sh as nobody exited early (%v):\n%s", err, out.String())
		case <-ctx.Done():
			t.Fatalf("run.sh as nobody did not get ready:\n%s", out.String())
		case <-time.After(200 * time.Millisecond):
		}
	}
	// Every process of the stack runs as nobody.
	pids := processesWithRoot(filepath.Join(runDir, "root"))
	if len(pids) < 4 {
		t.Fatalf("found %d stack processes, want the three services and the plugin", len(pids))
	}
	for _, pid := range pids {
		info, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid)))
		if err != nil {
			continue
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Uid != 65534 {
			t.Errorf("process %d runs as uid %d, want nobody", pid, st.Uid)
		}
	}
	// The same user reaches its own stack's APIs without sudo, with every
	// role (the services' own uid).
	for _, args := range [][]string{{"resources"}, {"allocate", "--pod", "p", "--container", "c", "example.com/sample=1"}, {"release", "--pod", "p"}} {
		ctl := asNobody(ctx, append([]string{filepath.Join(binDir, "nodeplugctl")}, args...)...)
		ctl.Env = append(os.Environ(), "NODEPLUG_ROOT_DIR="+filepath.Join(runDir, "root"))
		if got, err := ctl.CombinedOutput(); err != nil {
			t.Errorf("nodeplugctl %v as the stack's user: %v\n%s", args, err, got)
		}
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Logf("run.sh exited after SIGINT: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatalf("run.sh did not stop after SIGINT:\n%s", out.String())
	}
	if left := processesWithRoot(filepath.Join(runDir, "root")); len(left) > 0 {
		t.Errorf("processes left behind: %v", left)
	}
	if t.Failed() {
		t.Logf("run.sh output:\n%s", out.String())
	}
}
