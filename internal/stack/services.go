package stack

import (
	"context"
	"path/filepath"
	"sync"
	"time"
)

// Processes runs the three services over one root dir, each as a process of
// its own binary. Each serves its API on <root>/nodeplug/<service>.sock, so
// a restarted service is where its clients (the reconciler, tests) reconnect.
type Processes struct {
	Bin  string   // directory holding the binaries
	Root string   // --root-dir
	Env  []string // extra environment for every service

	mu    sync.Mutex
	procs map[string]*Process
	addrs map[string]string
}

// NewProcesses returns a Processes that has not started anything yet.
func NewProcesses(bin, root string, env ...string) *Processes {
	return &Processes{Bin: bin, Root: root, Env: env, procs: map[string]*Process{}, addrs: map[string]string{}}
}

// StartAll starts the watcher, the devicemanager and the reconciler, each
// once the previous one listens.
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
	args := []string{"--root-dir", s.Root, "--metrics-listen", "127.0.0.1:0", "--log-level", "info"}

	var p *Process
	var err error
	// A restart may race the old listener's teardown; retry briefly.
	for attempt := 0; ; attempt++ {
		p, err = Start(filepath.Join(s.Bin, "nodeplug-"+name), args, s.Env)
		if err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		var addr string
		addr, err = p.GRPCAddr(wctx)
		cancel()
		if err == nil {
			s.mu.Lock()
			s.procs[name] = p
			s.addrs[name] = addr
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
