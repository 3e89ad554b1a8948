package stack

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// Processes runs the four services over one root dir, each as a process of
// its own binary. Each serves its API on <root>/nodeplug/<service>.sock, so
// a restarted service is where its clients (the reconciler, tests) reconnect.
type Processes struct {
	Bin  string   // directory holding the binaries
	Root string   // --root-dir
	Env  []string // extra environment for every service
	// Args are extra arguments for every service. With --listen-tcp among
	// them, Start also waits for the bound TCP address (TCPAddr); give
	// 127.0.0.1:0 to let each service take a free port.
	Args []string

	mu       sync.Mutex
	procs    map[string]*Process
	addrs    map[string]string
	tcpAddrs map[string]string
}

// NoContainerRuntime is in every Processes' environment before its own:
// the dramanager runs no container of the pods of the node-local API
// unless a test asks for a runtime (NODEPLUG_DRAMANAGER_CONTAINER_RUNTIME
// in env), so that no test starts containers in the host's podman.
const NoContainerRuntime = "NODEPLUG_DRAMANAGER_CONTAINER_RUNTIME=none"

// NewProcesses returns a Processes that has not started anything yet. env
// is added to the services' environment (a later variable wins).
func NewProcesses(bin, root string, env ...string) *Processes {
	env = append([]string{NoContainerRuntime}, env...)
	return &Processes{Bin: bin, Root: root, Env: env, procs: map[string]*Process{}, addrs: map[string]string{}, tcpAddrs: map[string]string{}}
}

// StartAll starts the services (Services: the apiserver, the watcher, the
// devicemanager, the dramanager and the reconciler), each once the
// previous one listens.
func (s *Processes) StartAll(ctx context.Context) error {
	for _, name := range Services {
		if err := s.Start(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// Start starts (or restarts) one service and waits until it listens.
func (s *Processes) Start(ctx context.Context, name string) error {
	// Each service serves its API on <root>/nodeplug/<name>.sock, where
	// the reconciler finds its peers; the socket is named in the
	// info-level "gRPC listening" line, which says the service listens.
	args := append([]string{"--root-dir", s.Root, "--metrics-listen", "127.0.0.1:0", "--log-level", "info"}, s.Args...)
	tcp := slices.Contains(s.Args, "--listen-tcp")

	var p *Process
	var err error
	// A restart may race the old listener's teardown; retry briefly.
	for attempt := 0; ; attempt++ {
		p, err = Start(filepath.Join(s.Bin, "nodeplug-"+name), args, s.Env)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		var addr, tcpAddr string
		addr, err = p.GRPCAddr(wctx)
		if err == nil && tcp {
			// Logged right after the socket's line.
			tcpAddr, err = p.TCPAddr(wctx)
		}
		cancel()
		if err == nil {
			s.mu.Lock()
			s.procs[name] = p
			s.addrs[name] = addr
			s.tcpAddrs[name] = tcpAddr
			s.mu.Unlock()
			return nil
		}
		p.Kill()
		if attempt >= 5 || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Addr returns a service's gRPC address.
func (s *Processes) Addr(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrs[name]
}

// TCPAddr returns a service's bound --listen-tcp address (empty without
// --listen-tcp in Args). A restart with port 0 binds a new port.
func (s *Processes) TCPAddr(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tcpAddrs[name]
}

// Process returns a service's current process.
func (s *Processes) Process(name string) *Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[name]
}

// Kill SIGKILLs one service.
func (s *Processes) Kill(name string) {
	if p := s.Process(name); p != nil {
		p.Kill()
	}
}

// StopAll stops every service with SIGTERM, in reverse start order.
func (s *Processes) StopAll() {
	for i := len(Services) - 1; i >= 0; i-- {
		if p := s.Process(Services[i]); p != nil {
			_ = p.Stop(10 * time.Second)
		}
	}
}
