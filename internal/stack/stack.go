// Package stack builds nodeplug's binaries and runs them as real processes,
// finding their bound addresses from their logs: one Process per binary, and
// Processes for the four services over one root dir. The end-to-end tests,
// nodeplug-bench and the devicemanager's binary tests use it. (It is the
// process stack of tests and tools; the services compose themselves in
// their own main.go.)
package stack

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Services are the service binaries, in start order: the node-local
// resource API first, so that the DRA half (the dramanager) finds it; the
// reconciler last, once the peers it registers plugins with listen.
var Services = []string{"apiserver", "watcher", "devicemanager", "dramanager", "reconciler"}

// Packages maps binary names to their Go packages.
var Packages = map[string]string{
	"nodeplug-watcher":       "./services/watcher",
	"nodeplug-reconciler":    "./services/reconciler",
	"nodeplug-devicemanager": "./services/devicemanager",
	"nodeplug-apiserver":     "./services/apiserver",
	"nodeplug-dramanager":    "./services/dramanager",
	"nodeplug-sampleplugin":  "./cmd/nodeplug-sampleplugin",
	"nodeplugctl":            "./cmd/nodeplugctl",
	"nodeplug-bench":         "./cmd/nodeplug-bench",
	"nodeplug-console":       "./cmd/nodeplug-console",
}

// ModuleRoot returns the directory of nodeplug's go.mod.
func ModuleRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("cannot locate the source tree")
	}
	return filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Build builds the named binaries (keys of Packages) into dir, through the
// test binary cache (buildcache.go) unless NODEPLUG_TEST_BIN_CACHE=off.
func Build(ctx context.Context, dir string, names ...string) error {
	root, err := ModuleRoot()
	if err != nil {
		return err
	}
	for _, n := range names {
		if _, ok := Packages[n]; !ok {
			return fmt.Errorf("unknown binary %q", n)
		}
	}
	if cacheDir, ok := binCacheDir(); ok {
		return buildShared(ctx, root, cacheDir, dir, names)
	}
	return goBuild(ctx, root, dir, names)
}

// buildEnv is the environment the binaries are built in: static, as make
// builds them.
func buildEnv() []string { return append(os.Environ(), "CGO_ENABLED=0") }

// goBuild builds the named binaries into dir with one go build.
func goBuild(ctx context.Context, root, dir string, names []string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, Packages[n])
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = buildEnv()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build: %v\n%s", err, out)
	}
	// go build names binaries after their directory; rename to the real names.
	for _, n := range names {
		base := filepath.Base(Packages[n])
		if base != n {
			if err := os.Rename(filepath.Join(dir, base), filepath.Join(dir, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Process is one running binary.
type Process struct {
	Name string
	Cmd  *exec.Cmd

	mu      sync.Mutex
	log     bytes.Buffer
	addrs   map[string]string // log message → addr
	waitErr error
	done    chan struct{}
	addrCh  chan struct{}
}

// resourceAPIListenEnv is nodeplug-apiserver's --resource-api-listen.
const resourceAPIListenEnv = "NODEPLUG_APISERVER_RESOURCE_API_LISTEN"

// Start runs bin with args and extra env (KEY=VALUE). Logs must be JSON
// (Start adds --log-format json); stderr is kept for Logs and scanned for
// the bound addresses.
func Start(bin string, args []string, env []string) (*Process, error) {
	p := &Process{Name: filepath.Base(bin), addrs: map[string]string{}, done: make(chan struct{}), addrCh: make(chan struct{}, 1)}
	p.Cmd = exec.Command(bin, append([]string{"--log-format", "json"}, args...)...)
	p.Cmd.Env = append(os.Environ(), env...)
	// Many API servers run at once in tests: unless told otherwise each
	// serves its node-local resource API on a free port (kept across
	// restarts of one root dir), not on the default 6446.
	if p.Name == "nodeplug-apiserver" && !slices.ContainsFunc(p.Cmd.Env, func(e string) bool { return strings.HasPrefix(e, resourceAPIListenEnv+"=") }) {
		p.Cmd.Env = append(p.Cmd.Env, resourceAPIListenEnv+"=127.0.0.1:0")
	}
	if p.Name == "nodeplug-devicemanager" {
		p.Cmd.Env = append(p.Cmd.Env, cdiEnv(args, p.Cmd.Env)...)
	}
	p.Cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := p.Cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	p.Cmd.Stdout = io.Discard
	if err := p.Cmd.Start(); err != nil {
		return nil, err
	}
	go p.scan(stderr)
	return p, nil
}

// The devicemanager's CDI spec directories.
const (
	cdiSpecDirEnv  = "NODEPLUG_DEVICEMANAGER_CDI_SPEC_DIR"
	cdiSpecDirsEnv = "NODEPLUG_DEVICEMANAGER_CDI_SPEC_DIRS"
)

// cdiEnv keeps a devicemanager's CDI specs under its root dir unless told
// otherwise: many run at once in tests, and each removes at its start the
// specs of nodeplug's kind that it did not write (the host's /var/run/cdi
// is not theirs to share). Names resolve there alone.
func cdiEnv(args, env []string) []string {
	if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--cdi-spec-dir") }) ||
		slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, cdiSpecDirEnv) }) {
		return nil
	}
	root := ""
	for i, a := range args {
		if a == "--root-dir" && i+1 < len(args) {
			root = args[i+1]
		} else if v, ok := strings.CutPrefix(a, "--root-dir="); ok {
			root = v
		}
	}
	if root == "" {
		for _, e := range env {
			if v, ok := strings.CutPrefix(e, "NODEPLUG_ROOT_DIR="); ok {
				root = v
			}
		}
	}
	if root == "" {
		return nil
	}
	dir := filepath.Join(root, "cdi")
	return []string{cdiSpecDirEnv + "=" + dir, cdiSpecDirsEnv + "=" + dir}
}

// addrKey is in every log line that names an address ("addr", "tcp_addr").
var addrKey = []byte(`addr"`)

func (p *Process) scan(r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var rec struct {
			Msg     string `json:"msg"`
			Addr    string `json:"addr"`
			TCPAddr string `json:"tcp_addr"` // "gRPC listening on TCP"
		}
		p.mu.Lock()
		p.log.Write(line)
		p.log.WriteByte('\n')
		// Only a line with an address is decoded: a burst of registrations
		// logs thousands of lines, and the bench's plugins share the CPU
		// with this loop.
		if bytes.Contains(line, addrKey) && json.Unmarshal(line, &rec) == nil && (rec.Addr != "" || rec.TCPAddr != "") {
			if rec.Addr != "" {
				p.addrs[rec.Msg] = rec.Addr
			} else {
				p.addrs[rec.Msg] = rec.TCPAddr
			}
			select {
			case p.addrCh <- struct{}{}:
			default:
			}
		}
		p.mu.Unlock()
	}
	err := p.Cmd.Wait()
	p.mu.Lock()
	p.waitErr = err
	p.mu.Unlock()
	close(p.done)
}

// Addr waits until the process has logged msg with an addr (or tcp_addr)
// attribute (for the services: "gRPC listening", "gRPC listening on TCP" or
// "metrics listening") and returns it.
func (p *Process) Addr(ctx context.Context, msg string) (string, error) {
	for {
		p.mu.Lock()
		a, ok := p.addrs[msg]
		p.mu.Unlock()
		if ok {
			return a, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("%s did not log %q: %w\n%s", p.Name, msg, ctx.Err(), p.Logs())
		case <-p.done:
			return "", fmt.Errorf("%s exited (%v) before logging %q\n%s", p.Name, p.Err(), msg, p.Logs())
		case <-p.addrCh:
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// GRPCAddr is Addr(ctx, "gRPC listening").
func (p *Process) GRPCAddr(ctx context.Context) (string, error) { return p.Addr(ctx, "gRPC listening") }

// TCPAddr is Addr(ctx, "gRPC listening on TCP"): the bound --listen-tcp
// address.
func (p *Process) TCPAddr(ctx context.Context) (string, error) {
	return p.Addr(ctx, "gRPC listening on TCP")
}

// Logs returns everything the process wrote to stderr so far.
func (p *Process) Logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// LogLines returns the decoded JSON log records whose msg contains substr.
func (p *Process) LogLines(substr string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.Logs(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil {
			continue
		}
		if m, _ := rec["msg"].(string); strings.Contains(m, substr) {
			out = append(out, rec)
		}
	}
	return out
}

// Err is the process's exit error, once it has exited.
func (p *Process) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.waitErr
}

// Kill sends SIGKILL and waits for the exit.
func (p *Process) Kill() {
	_ = p.Cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to timeout for the exit, then kills.
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.Err()
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not stop within %v after SIGTERM", p.Name, timeout)
	}
}
