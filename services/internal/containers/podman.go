package containers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"
)

// PodmanConfig says how to run podman.
type PodmanConfig struct {
	// Path is the podman executable, or a program that runs it with the
	// same arguments. Empty: podman, looked up on PATH.
	Path string
	// Args are global arguments, put before every subcommand (--root,
	// --runroot, --log-level and the like).
	Args []string
	// Env is added to the environment podman runs with (os.Environ),
	// such as CONTAINERS_CONF and CONTAINERS_STORAGE_CONF.
	Env []string
	// Network is the network mode of every container (podman's
	// --network: "none", "host", "bridge", ...). Empty: podman's default.
	Network string
}

// Podman is a Runtime driving podman's command line, one podman command
// per operation. It keeps no state of its own, so several Podmans (and
// processes) may share podman's storage.
type Podman struct {
	cli
	network string
	version string
}

var _ Runtime = (*Podman)(nil)

// versionTimeout bounds NewPodman's question to podman.
const versionTimeout = time.Minute

// waitDelay is how long a podman command has to exit, once its context
// is done and it has been sent SIGTERM, before it is killed; and how
// long its output may stay open once it has exited (a child it left
// behind holding it).
const waitDelay = 10 * time.Second

// NewPodman checks that podman answers, asking its version, and returns
// a Podman running it as cfg says.
func NewPodman(cfg PodmanConfig) (*Podman, error) {
	path := cfg.Path
	if path == "" {
		var err error
		if path, err = exec.LookPath("podman"); err != nil {
			return nil, fmt.Errorf("podman is not installed: %w", err)
		}
	}
	p := &Podman{cli: cli{path: path, args: slices.Clone(cfg.Args), env: slices.Clone(cfg.Env)}, network: cfg.Network}
	ctx, cancel := context.WithTimeout(context.Background(), versionTimeout)
	defer cancel()
	out, err := p.command(ctx, "podman version", "version", "--format", "json")
	if err != nil {
		return nil, fmt.Errorf("podman (%s) does not answer: %w", path, err)
	}
	v, err := parseVersion(out)
	if err != nil {
		return nil, fmt.Errorf("podman (%s): %w", path, err)
	}
	p.version = v
	return p, nil
}

// parseVersion reads the output of podman version --format json: the
// version of the engine that runs the containers (the server's, when
// podman is a remote client).
func parseVersion(out []byte) (string, error) {
	var v struct {
		Client *struct{ Version string }
		Server *struct{ Version string }
	}
	if err := json.Unmarshal(out, &v); err != nil {
		return "", fmt.Errorf("reading podman version --format json: %w: %q", err, clipOutput(out))
	}
	switch {
	case v.Server != nil && v.Server.Version != "":
		return v.Server.Version, nil
	case v.Client != nil && v.Client.Version != "":
		return v.Client.Version, nil
	}
	return "", fmt.Errorf("podman version --format json names no version: %q", clipOutput(out))
}

// Name is "podman <version>".
func (p *Podman) Name() string { return "podman " + p.version }

// CommandError is a podman command that failed.
type CommandError struct {
	// Command names the command: podman, its subcommand and what it was
	// about (not every argument: a container's environment may hold
	// secrets).
	Command string
	// Stderr is what podman wrote to its standard error, trimmed.
	Stderr string
	// Err is why the command failed: its exit status (*exec.ExitError),
	// an error starting it, or the context's error when that ended it.
	Err error
}

func (e *CommandError) Error() string {
	msg := e.Command + ": " + e.Err.Error()
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}

func (e *CommandError) Unwrap() error { return e.Err }

// ExitCode is podman's exit code, or -1 when it did not exit by itself.
func (e *CommandError) ExitCode() int {
	var ee *exec.ExitError
	if errors.As(e.Err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// noSuchContainer is in podman's message about a container it does not
// have (libpod's define.ErrNoSuchCtr).
const noSuchContainer = "no such container"

// isNoSuchContainer is whether err is podman saying it has no such
// container.
func isNoSuchContainer(err error) bool {
	var ce *CommandError
	return errors.As(err, &ce) && strings.Contains(strings.ToLower(ce.Stderr), noSuchContainer)
}

// cli runs a runtime's command line: its executable, the global
// arguments put before every command's, and the variables added to the
// environment.
type cli struct {
	path string
	args []string
	env  []string
}

// command runs the executable with args after the global arguments and
// returns its standard output; what names the command in the error (a
// CommandError). When ctx ends, it gets SIGTERM, so that it can let go of
// its locks, and SIGKILL waitDelay later.
func (c cli) command(ctx context.Context, what string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.path, append(slices.Clone(c.args), args...)...)
	cmd.Env = append(os.Environ(), c.env...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = waitDelay
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			err = fmt.Errorf("%w (%v)", ctxErr, err)
		}
		return stdout.Bytes(), &CommandError{Command: what, Stderr: strings.TrimSpace(stderr.String()), Err: err}
	}
	return stdout.Bytes(), nil
}

// clipOutput shortens output quoted in an error.
func clipOutput(b []byte) string {
	const limit = 512
	s := strings.TrimSpace(string(b))
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}
