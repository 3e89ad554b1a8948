package conform

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
)

// process is the started plugin.
type process struct {
	cmd  *exec.Cmd
	out  *stack.Tail
	done chan struct{}

	mu    sync.Mutex
	state string // how it exited
	code  int    // exit code, -1 for a signal
}

func startProcess(argv, env []string, extra io.Writer) (*process, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	// Its own process group, so that what it starts is ended with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t := &stack.Tail{Max: 64 << 10}
	var w io.Writer = t
	if extra != nil {
		w = io.MultiWriter(t, extra)
	}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	p := &process{cmd: cmd, out: t, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.code = cmd.ProcessState.ExitCode()
		p.state = cmd.ProcessState.String()
		if err != nil && !errors.As(err, new(*exec.ExitError)) {
			p.state += " (" + err.Error() + ")"
		}
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// exitState says how the process exited, and whether it did.
func (p *process) exitState() (string, bool) {
	select {
	case <-p.done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.state, true
	default:
		return "", false
	}
}

func (p *process) exitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.code
}

func (p *process) alive() bool {
	_, done := p.exitState()
	return !done
}

// kill ends the process and its group with SIGKILL and waits for it.
func (p *process) kill() {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

func (p *process) output() string { return p.out.String() }
