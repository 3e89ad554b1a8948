package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nodeplug/nodeplug/internal/stack"
)

// pprofEnv turns on each service's /debug/pprof/ (beside /metrics, on
// loopback) when profiles are asked for.
func pprofEnv(cfg Config) []string {
	if cfg.PprofDir == "" {
		return nil
	}
	var env []string
	for _, s := range stack.Services {
		env = append(env, "NODEPLUG_"+strings.ToUpper(s)+"_PPROF=true")
	}
	return env
}

// profiles takes a CPU profile of every service for cfg.PprofSeconds, from
// now, into cfg.PprofDir/<service>.cpu.pprof. The returned function waits
// for them and reports the first failure. With no PprofDir it does nothing.
func (r *runner) profiles(ctx context.Context) func() error {
	if r.cfg.PprofDir == "" {
		return func() error { return nil }
	}
	secs := r.cfg.PprofSeconds
	if secs <= 0 {
		secs = 20
	}
	if err := os.MkdirAll(r.cfg.PprofDir, 0o755); err != nil {
		return func() error { return err }
	}
	var wg sync.WaitGroup
	errs := make([]error, len(stack.Services))
	for i, name := range stack.Services {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.profile(ctx, name, secs)
		}()
	}
	r.logf("profiling every service's CPU for %d s into %s", secs, r.cfg.PprofDir)
	return func() error {
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
		return nil
	}
}

func (r *runner) profile(ctx context.Context, name string, secs int) error {
	return r.fetchProfile(ctx, name, fmt.Sprintf("profile?seconds=%d", secs), name+".cpu.pprof")
}

// heapProfile writes a heap profile of service name, taken after a GC, to
// cfg.PprofDir/<name>.heap-<label>.pprof (compare two with `go tool pprof
// -diff_base`), its text form to <name>.heap-<label>.txt and the goroutines
// grouped by stack to <name>.goroutine-<label>.txt, when profiles are asked
// for.
func (r *runner) heapProfile(ctx context.Context, name, label string) error {
	if r.cfg.PprofDir == "" {
		return nil
	}
	if err := os.MkdirAll(r.cfg.PprofDir, 0o755); err != nil {
		return err
	}
	if err := r.fetchProfile(ctx, name, "heap?gc=1", name+".heap-"+label+".pprof"); err != nil {
		return err
	}
	// The text form ends with the runtime's MemStats: heap in use, idle
	// and released, stacks, and the runtime's own overhead, which is where
	// an RSS larger than the live heap goes.
	if err := r.fetchProfile(ctx, name, "heap?debug=1", name+".heap-"+label+".txt"); err != nil {
		return err
	}
	// Which goroutines exist, grouped by stack: per connection, which
	// ones a service keeps and where they wait.
	return r.fetchProfile(ctx, name, "goroutine?debug=1", name+".goroutine-"+label+".txt")
}

// fetchProfile gets /debug/pprof/<what> of service name into
// cfg.PprofDir/file.
func (r *runner) fetchProfile(ctx context.Context, name, what, file string) error {
	p := r.st.Process(name)
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	addr, err := p.Addr(actx, "metrics listening")
	cancel()
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/%s", addr, what), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile of %s: %w", name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile of %s: %s", name, resp.Status)
	}
	f, err := os.Create(filepath.Join(r.cfg.PprofDir, file))
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return fmt.Errorf("profile of %s: %w", name, err)
	}
	return f.Close()
}
