package conform

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// A plugin may serve several resources, each registered on its own
// (generic-device-plugin registers one per device group): the first to
// register is r itself, every other one a sub-runner in r.others whose
// registration and device checks run as r's did. finish merges their
// results into one row per check that names every resource.

// perResource are the checks that run once per resource.
var perResource = append([]string{CheckGetInfo, CheckDriverService, CheckNotify, CheckRegisterRequest}, deviceChecks...)

// sub returns a runner for another resource of the same plugin.
func (r *runner) sub() *runner {
	return &runner{
		cfg: r.cfg, log: r.log, report: &Report{}, results: map[string]Result{}, confiner: r.confiner,
		root: r.root, kubelet: r.kubelet, proc: r.proc,
	}
}

// resourceName names the resource a runner checked.
func (r *runner) resourceName() string {
	if r.report.Plugin != "" {
		return r.report.Plugin
	}
	if r.sess != nil {
		return r.sess.endpoint
	}
	return r.regSock
}

// checkOtherResources finds the plugin's other registrations, those that
// arrived while the first was checked, or, with Config.Resources, once that
// many registered (within RegisterWait): Register calls on kubelet.sock for
// another resource and other sockets in plugins_registry. Each is checked
// as the first was.
func (r *runner) checkOtherResources(ctx context.Context) {
	if r.cfg.Resources > 1 {
		poll(ctx, r.cfg.RegisterWait, func() bool { return r.registeredResources() >= r.cfg.Resources })
	}
	seen := map[string]bool{r.resourceName(): true}
	for i := 0; ; i++ {
		reg, _ := r.kubelet.next(i)
		if reg == nil {
			break
		}
		name := reg.req.GetResourceName()
		if seen[name] {
			continue
		}
		seen[name] = true
		s := r.sub()
		s.onRegister(reg)
		s.deviceChecks(ctx)
		r.others = append(r.others, s)
	}
	for _, sock := range findSockets(r.registryDir()) {
		if sock == r.regSock || slices.ContainsFunc(r.others, func(o *runner) bool { return o.regSock == sock }) {
			continue
		}
		s := r.sub()
		s.registerViaSocket(ctx, sock, false)
		s.skip("registers through plugins_registry", CheckRegisterRequest)
		if seen[s.resourceName()] {
			s.sess.close()
			continue
		}
		seen[s.resourceName()] = true
		s.deviceChecks(ctx)
		r.others = append(r.others, s)
	}
}

// registeredResources counts the plugin's registrations so far: the
// resources named on kubelet.sock, and the sockets in plugins_registry.
func (r *runner) registeredResources() int {
	names := map[string]bool{}
	for i := 0; ; i++ {
		reg, _ := r.kubelet.next(i)
		if reg == nil {
			break
		}
		names[reg.req.GetResourceName()] = true
	}
	return len(names) + len(findSockets(r.registryDir()))
}

// findSockets returns every socket under dir, as the kubelet's walk finds
// them (lexical order, entries starting with "." skipped).
func findSockets(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return filepath.SkipDir
		}
		if path != dir && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.Type()&fs.ModeSocket != 0 {
			out = append(out, path)
		}
		return nil
	})
	return out
}

// rank orders statuses for merging: the worst of the resources stands.
func rank(s Status) int {
	switch s {
	case Fail:
		return 3
	case Warn:
		return 2
	case Pass:
		return 1
	}
	return 0
}

// merged returns the result of check c over r and r.others: the worst
// status, and each resource's detail under its name.
func (r *runner) merged(c Check, res Result) Result {
	if len(r.others) == 0 || !slices.Contains(perResource, c.Name) {
		return res
	}
	out := res
	details := []string{fmt.Sprintf("%s: %s", r.resourceName(), res.Detail)}
	for _, o := range r.others {
		ores, ok := o.results[c.Name]
		if !ok {
			ores = Result{Check: c, Status: Skip, Detail: "not run"}
		}
		if rank(ores.Status) > rank(out.Status) {
			out.Status = ores.Status
		}
		out.Elapsed += ores.Elapsed
		details = append(details, fmt.Sprintf("%s: %s", o.resourceName(), ores.Detail))
	}
	out.Detail = strings.Join(details, " | ")
	return out
}

// resources names every resource checked, in the order they registered.
func (r *runner) resources() []string {
	if r.report.Plugin == "" {
		return nil
	}
	out := []string{r.resourceName()}
	for _, o := range r.others {
		out = append(out, o.resourceName())
	}
	return out
}

// otherSockets are the sockets of the other resources.
func (r *runner) otherSockets() []string {
	var out []string
	for _, o := range r.others {
		out = append(out, o.ownSockets()...)
	}
	return out
}

// waitRegistered waits, until deadline, for a Register call after the
// first n for each of names, and returns those that did not come and the
// one for first (nil if it did not come).
func (r *runner) waitRegistered(ctx context.Context, n int, first string, names []string, deadline time.Time) (*registration, []string) {
	var got *registration
	var missing []string
	poll(ctx, time.Until(deadline), func() bool {
		found := map[string]bool{}
		got = nil
		for i := n; ; i++ {
			reg, _ := r.kubelet.next(i)
			if reg == nil {
				break
			}
			name := reg.req.GetResourceName()
			found[name] = true
			if name == first && got == nil {
				got = reg
			}
		}
		missing = missing[:0]
		for _, name := range append([]string{first}, names...) {
			if !found[name] {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0 || !r.proc.alive()
	})
	return got, missing
}
