package chaos

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nodeplug/nodeplug/pkg/layout"
)

// unusable is the devicemanager's loud log line for a checkpoint it moved
// aside (services/devicemanager/internal/manager).
const unusable = "CHECKPOINT UNUSABLE"

func (h *harness) checkpoint() string {
	return filepath.Join(layout.DevicePluginsDir(h.root), layout.CheckpointFileName)
}

// asides returns the checkpoint files (snapshot and journals) moved aside
// so far.
func (h *harness) asides() []string {
	m, _ := filepath.Glob(h.checkpoint() + "*.corrupt-*")
	return m
}

// bursts kills the devicemanager in the middle of Allocate bursts: each
// time the restarted devicemanager must find its checkpoint valid and list
// every acknowledged allocation.
func (h *harness) bursts(ctx context.Context) error {
	if h.cfg.Bursts == 0 {
		return nil
	}
	h.logf("bursts: %d devicemanager kills in the middle of Allocate bursts", h.cfg.Bursts)
	for i := range h.cfg.Bursts {
		var once sync.Once
		answered := make(chan struct{})
		var uncertain0 int
		err := h.killUnderLoad(ctx, fmt.Sprintf("burst %d", i+1),
			func(cctx context.Context, c int, named func(string)) {
				rs := h.stableResources()
				for k := 0; cctx.Err() == nil; k++ {
					pod := fmt.Sprintf("burst-%d-%d-%d", i, c, k)
					named(pod)
					_, err := h.allocate(cctx, pod, rs[h.intn(len(rs))], 1)
					if err == nil {
						once.Do(func() { close(answered) })
					} else if !definite(err) {
						return // the devicemanager is gone
					}
				}
			},
			func(done <-chan struct{}) error {
				// Kill a random few milliseconds after the first answer.
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-answered:
				case <-done:
				case <-time.After(h.cfg.Converge): // every device taken: kill anyway
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(time.Duration(h.intn(20)) * time.Millisecond):
				}
				h.mu.Lock()
				uncertain0 = h.res.Uncertain
				h.mu.Unlock()
				return nil
			},
			func() {
				h.mu.Lock()
				h.res.BurstKills++
				h.res.BurstUncertain += h.res.Uncertain - uncertain0
				h.mu.Unlock()
			})
		if err != nil {
			return err
		}
	}
	_, err := h.converge(ctx, "end of bursts", "")
	return err
}

// killUnderLoad runs one client per h.cfg.Clients (client names every pod
// it uses and returns when its context ends or the devicemanager is gone),
// waits for ready (done is closed once every client returned), SIGKILLs
// and restarts the devicemanager, and calls killed once the clients are
// stopped. The restarted devicemanager must have found its checkpoint
// valid (no loud log, nothing moved aside) and converge; the clients' pods
// are then released, so that the next round finds free devices.
func (h *harness) killUnderLoad(ctx context.Context, when string, client func(ctx context.Context, c int, named func(pod string)), ready func(done <-chan struct{}) error, killed func()) error {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var pods []string
	named := func(pod string) {
		mu.Lock()
		pods = append(pods, pod)
		mu.Unlock()
	}
	for c := range h.cfg.Clients {
		wg.Go(func() { client(cctx, c, named) })
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if err := ready(done); err != nil {
		return err
	}
	before := len(h.asides())
	if err := h.killRestart(ctx, "devicemanager"); err != nil {
		return err
	}
	cancel()
	<-done
	killed()
	if lines := h.st.Process("devicemanager").LogLines(unusable); len(lines) > 0 || len(h.asides()) != before {
		h.violate(Violation{Invariant: "a", When: when, Detail: fmt.Sprintf("checkpoint not valid after kill -9 under load: %v", lines)})
	}
	if _, err := h.converge(ctx, when, "devicemanager"); err != nil {
		return err
	}
	return h.releaseAll(ctx, pods)
}

// FaultResult is what happened to one kind of checkpoint damage.
type FaultResult struct {
	Kind string `json:"kind"`
	// Quiet: the damage is a torn write, which the devicemanager drops
	// without a word and without moving anything aside.
	Quiet bool `json:"quiet"`
	// Skipped says why the fault was not applied.
	Skipped string `json:"skipped,omitempty"`
	// Started: the devicemanager came back and served.
	Started bool `json:"started"`
	// Loud: it logged CHECKPOINT UNUSABLE.
	Loud bool `json:"loud_log"`
	// MovedAside is the file the damaged checkpoint was moved to.
	MovedAside string `json:"moved_aside,omitempty"`
	// Converged: plugins registered again and every invariant held after.
	Converged bool `json:"converged"`
	// AllocationsBefore and AllocationsAfter: listed before the damage and
	// after the restart (a checkpoint moved aside starts empty).
	AllocationsBefore int    `json:"allocations_before"`
	AllocationsAfter  int    `json:"allocations_after"`
	Note              string `json:"note,omitempty"`
}

// OK says whether the fault was handled as DESIGN "Checkpoint" says: a
// torn write dropped quietly, any other damage moved aside with a loud
// log; the service started and converged either way. A fault skipped is
// not OK, unless it cannot be applied at all here (see the body).
func (f FaultResult) OK() bool {
	if f.Skipped != "" {
		// Only a mode-0000 file cannot be tried as root, whom the mode
		// does not stop; any other skip is damage the run meant to
		// apply and did not.
		return strings.HasSuffix(f.Kind, "unreadable") && os.Geteuid() == 0
	}
	if f.Quiet {
		return f.Started && !f.Loud && f.MovedAside == "" && f.Converged
	}
	return f.Started && f.Loud && f.MovedAside != "" && f.Converged
}

// FaultKinds are the kinds of checkpoint damage, in the order applied: to
// the snapshot, then to the journal ("journal-" kinds). Journal damage:
// torn-tail appends half a record (a write cut by a crash: nothing
// acknowledged is lost); truncated cuts the last record in half, which
// is a torn write too (its change is lost: a cut cannot be told from a
// tear); flipped-byte damages the first record, with records after it;
// zeroed-record zeros the first record's payload, with records after it
// (damage, not a torn write: a tear is only ever the last record); the
// others replace the whole file, as for the snapshot.
var FaultKinds = []string{"truncated", "flipped-byte", "empty", "random-bytes", "foreign-json", "directory", "symlink", "unreadable",
	"journal-torn-tail", "journal-truncated", "journal-flipped-byte", "journal-zeroed-record", "journal-empty", "journal-random-bytes",
	"journal-foreign-json", "journal-directory", "journal-symlink", "journal-unreadable"}

// quietFault says whether the devicemanager takes the damage of kind as a
// torn write; lossless, whether nothing acknowledged is lost by it.
func quietFault(kind string) (quiet, lossless bool) {
	switch kind {
	case "journal-torn-tail":
		return true, true
	case "journal-truncated":
		return true, false
	}
	return false, false
}

// damageJournal alters the journal at path, whose valid content is b.
func damageJournal(kind, path string, b []byte) (skip string, err error) {
	fr := frames(b)
	if len(fr) < 3 {
		return fmt.Sprintf("the journal held %d records when the devicemanager stopped", max(len(fr)-1, 0)), nil
	}
	write := func(data []byte) error {
		if err := os.Remove(path); err != nil {
			return err
		}
		return os.WriteFile(path, data, 0o600)
	}
	last, first := fr[len(fr)-1], fr[1]
	switch kind {
	case "journal-torn-tail":
		c := append([]byte(nil), b...)
		return "", write(append(c, b[last[0]:last[0]+last[1]/2]...))
	case "journal-truncated":
		return "", write(b[:last[0]+last[1]/2])
	case "journal-flipped-byte":
		c := append([]byte(nil), b...)
		c[first[0]+frameHeader+(first[1]-frameHeader)/2] ^= 0x20
		return "", write(c)
	case "journal-zeroed-record":
		c := append([]byte(nil), b...)
		clear(c[first[0]+frameHeader : first[0]+first[1]])
		return "", write(c)
	}
	return damage(strings.TrimPrefix(kind, "journal-"), path, b)
}

// damage alters the checkpoint at path, whose valid content is b.
func damage(kind, path string, b []byte) (skip string, err error) {
	write := func(data []byte) error {
		if err := os.Remove(path); err != nil {
			return err
		}
		return os.WriteFile(path, data, 0o600)
	}
	switch kind {
	case "truncated":
		return "", write(b[:len(b)/2])
	case "flipped-byte":
		c := append([]byte(nil), b...)
		c[len(c)/2] ^= 0x20
		return "", write(c)
	case "empty":
		return "", write(nil)
	case "random-bytes":
		r := make([]byte, 4096)
		_, _ = rand.Read(r)
		return "", write(r)
	case "foreign-json":
		return "", write([]byte(`{"kind":"SomethingElse","items":[{"name":"x","count":3}],"checksum":"0"}` + "\n"))
	case "directory":
		if err := os.Remove(path); err != nil {
			return "", err
		}
		if err := os.Mkdir(path, 0o750); err != nil {
			return "", err
		}
		return "", os.WriteFile(filepath.Join(path, "inside"), b, 0o600)
	case "symlink":
		// A valid checkpoint elsewhere, linked into place: never followed.
		target := path + "-elsewhere"
		if err := os.WriteFile(target, b, 0o600); err != nil {
			return "", err
		}
		if err := os.Remove(path); err != nil {
			return "", err
		}
		return "", os.Symlink(target, path)
	case "unreadable":
		if os.Geteuid() == 0 {
			return "running as root, which reads a mode-0000 file anyway", nil
		}
		return "", os.Chmod(path, 0)
	}
	return "", fmt.Errorf("unknown fault %q", kind)
}

// faults stops the devicemanager, damages its checkpoint, starts it, and
// checks it moved the file aside with a loud log and came back: the
// reconciler registers the plugins_registry plugins again, and the
// harness re-registers the kubelet.sock ones, as such plugins do when
// kubelet.sock reappears.
func (h *harness) faults(ctx context.Context) error {
	h.logf("faults: %s", strings.Join(FaultKinds, ", "))
	for _, kind := range FaultKinds {
		f, err := h.fault(ctx, kind)
		h.mu.Lock()
		h.res.Faults = append(h.res.Faults, f)
		h.mu.Unlock()
		h.logf("  %-13s started=%v loud=%v moved_aside=%v converged=%v allocations %d→%d %s%s", kind, f.Started, f.Loud, f.MovedAside != "", f.Converged, f.AllocationsBefore, f.AllocationsAfter, f.Skipped, f.Note)
		if err != nil {
			return fmt.Errorf("fault %s: %w", kind, err)
		}
	}
	return nil
}

// fault stops the devicemanager, applies the damage of kind to its
// checkpoint (to the journal for "journal-" kinds), starts it again and
// records how it took the damage.
func (h *harness) fault(ctx context.Context, kind string) (FaultResult, error) {
	quiet, lossless := quietFault(kind)
	r := &faultRun{h: h, kind: kind, journal: strings.HasPrefix(kind, "journal-"), lossless: lossless,
		res: FaultResult{Kind: kind, Quiet: quiet}}
	err := r.prepare(ctx)
	if err == nil {
		err = r.apply(ctx)
	}
	if err == nil {
		if r.res.Skipped != "" {
			err = r.settleSkipped(ctx)
		} else {
			err = r.check(ctx)
		}
	}
	return r.res, err
}

// faultRun is one fault while it is applied and checked.
type faultRun struct {
	h        *harness
	kind     string
	journal  bool // the damage is to the journal, not the snapshot
	lossless bool // the damage loses nothing acknowledged
	path     string
	before   int      // checkpoint files moved aside before the damage
	pods     []string // the fault's pods, released at the end
	res      FaultResult
}

// prepare makes allocations for the checkpoint to hold, fills the journal
// when it is the one to damage, and records the allocations listed before
// the damage.
func (r *faultRun) prepare(ctx context.Context) error {
	h := r.h
	// Some allocations, so that the checkpoint holds some: one device of
	// each of the first resources that has one free.
	made := 0
	for _, rs := range h.stableResources() {
		if made == 4 {
			break
		}
		_, err := h.allocate(ctx, fmt.Sprintf("fault-%s-%d", r.kind, made), rs, 1)
		switch {
		case err == nil:
			made++
		case !definite(err):
			return fmt.Errorf("allocate before the fault: %w", err)
		}
	}
	r.fillJournal(ctx)
	s, err := h.snapshot(ctx)
	if err != nil {
		return err
	}
	r.res.AllocationsBefore = len(s.Allocations)
	for _, a := range s.Allocations {
		if strings.HasPrefix(a.Key.Pod, "fault-") {
			r.pods = append(r.pods, a.Key.Pod)
		}
	}
	return nil
}

// fillJournal, for journal damage, allocates and releases until the
// newest journal holds two records: a compaction may just have started a
// new one, and a journal to damage holds records.
func (r *faultRun) fillJournal(ctx context.Context) {
	h := r.h
	for i := 0; r.journal && i < 20; i++ {
		js := h.journals()
		if len(js) > 0 {
			if b, err := os.ReadFile(js[len(js)-1]); err == nil && len(frames(b)) >= 3 {
				break
			}
		}
		pod := fmt.Sprintf("fault-%s-filler-%d", r.kind, i)
		r.pods = append(r.pods, pod)
		if holds, _ := h.allocate(ctx, pod, h.stableResources()[0], 1); holds {
			h.release(ctx, pod)
		}
	}
}

// apply stops the devicemanager, damages its checkpoint (or records why
// the damage was skipped) and starts it again.
func (r *faultRun) apply(ctx context.Context) error {
	h := r.h
	if err := h.st.Process("devicemanager").Stop(10 * time.Second); err != nil {
		return fmt.Errorf("stop the devicemanager: %w", err)
	}
	r.path = h.checkpoint()
	if r.journal {
		js := h.journals()
		if len(js) == 0 {
			return fmt.Errorf("no journal beside %s", r.path)
		}
		r.path = js[len(js)-1]
	}
	b, err := os.ReadFile(r.path)
	if err != nil {
		return err
	}
	r.before = len(h.asides())
	var skip string
	if r.journal {
		skip, err = damageJournal(r.kind, r.path, b)
	} else {
		skip, err = damage(r.kind, r.path, b)
	}
	if err != nil {
		return err
	}
	r.res.Skipped = skip
	if err := h.st.Start(ctx, "devicemanager"); err != nil {
		return fmt.Errorf("devicemanager did not start: %w", err)
	}
	r.res.Started = true
	return nil
}

// settleSkipped, when the damage was skipped, waits for the restarted
// devicemanager to converge and releases the fault's pods.
func (r *faultRun) settleSkipped(ctx context.Context) error {
	h := r.h
	_, err := h.converge(ctx, "fault "+r.kind, "")
	r.res.Converged = err == nil
	if s, serr := h.snapshot(ctx); serr == nil {
		r.res.AllocationsAfter = len(s.Allocations)
	}
	if err == nil {
		err = h.releaseAll(ctx, r.pods)
	}
	return err
}

// check records whether the devicemanager logged the damage loudly and
// moved the file aside, waits for it to converge with what the damage
// lost forgotten, and tidies up.
func (r *faultRun) check(ctx context.Context) error {
	h := r.h
	r.res.Loud = len(h.st.Process("devicemanager").LogLines(unusable)) > 0
	if a := h.asides(); len(a) > r.before {
		r.res.MovedAside = a[len(a)-1]
	}
	// Damage is state lost on purpose (all of it, or the records a journal's
	// damage touched; journal.go checks that the rest are kept): what was
	// acknowledged or released before it no longer binds, and the kubelet.sock
	// plugins register again. A torn write loses nothing acknowledged.
	if !r.lossless {
		h.forgetState()
	}
	if _, err := h.converge(ctx, "fault "+r.kind, ""); err != nil {
		return err
	}
	r.res.Converged = true
	if s, err := h.snapshot(ctx); err == nil {
		r.res.AllocationsAfter = len(s.Allocations)
	}
	if r.res.MovedAside == "" && !r.res.Quiet {
		fi, err := os.Lstat(r.path)
		r.res.Note = fmt.Sprintf("nothing moved aside; %s now: %v %v", filepath.Base(r.path), modeOf(fi), err)
	}
	return r.tidy(ctx)
}

// tidy removes what the fault left (the files moved aside, a symlink's
// target) and releases the fault's pods, freeing their devices for the
// next fault.
func (r *faultRun) tidy(ctx context.Context) error {
	h := r.h
	for _, a := range h.asides() {
		_ = os.RemoveAll(a)
	}
	_ = os.Remove(r.path + "-elsewhere")
	if s, err := h.snapshot(ctx); err == nil {
		for _, a := range s.Allocations {
			if strings.HasPrefix(a.Key.Pod, "fault-") {
				r.pods = append(r.pods, a.Key.Pod)
			}
		}
	}
	return h.releaseAll(ctx, r.pods)
}

// forgetState forgets every acknowledged and released allocation and
// marks every plugin unregistered, as after damage that lost the
// devicemanager's state; the load is paused meanwhile.
func (h *harness) forgetState() {
	h.pause.Lock()
	h.mu.Lock()
	h.acked = map[AllocKey][]string{}
	h.released = map[string]bool{}
	for _, p := range h.plugins {
		p.registered = false
	}
	h.mu.Unlock()
	h.pause.Unlock()
}

func modeOf(fi os.FileInfo) string {
	if fi == nil {
		return "-"
	}
	return fi.Mode().String()
}
