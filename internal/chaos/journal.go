// This file is the journal phase (issue 34, D5): two ways a journal can
// hold less than the devicemanager acknowledged, each with its check.
//
//   - A sector of zeros inside the second of ten records (a disk, a
//     person): the devicemanager must start with every record outside the
//     damage (those after it too), and name in its loud line the bytes it
//     could not read, covering every record the zeros touched.
//   - A Release whose save fails: the journal file and its directory are
//     made immutable (chattr +i), which fails the devicemanager's writes
//     even as root, as a disk that returns EIO or EPERM does. The Release
//     must fail and be taken back: the pod keeps its devices in memory,
//     no other pod gets them, a kill -9 then (the disk working again)
//     restarts with the pod holding them, and the Release retried once the
//     disk works frees them for good.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

// JournalResults is what the journal phase found.
type JournalResults struct {
	Gap     GapResult     `json:"gap"`
	Unsaved UnsavedResult `json:"unsaved_release"`
}

// OK says whether both scenarios held (a scenario that cannot be made here
// is not a failure; it says why in Skipped).
func (r JournalResults) OK() bool { return r.Gap.OK() && r.Unsaved.OK() }

// GapResult is the zeroed sector inside the second of ten records.
type GapResult struct {
	Skipped string `json:"skipped,omitempty"`
	Ran     bool   `json:"ran"`
	// Lost are the pods whose records the zeros touched; Recovered and
	// Expected count the scenario's pods listed after the restart and
	// those the records outside the damage say are held.
	Lost      []string `json:"lost"`
	Recovered int      `json:"recovered"`
	Expected  int      `json:"expected"`
	// Named: the loud line named bytes covering every record touched.
	Named bool   `json:"named"`
	Spans string `json:"spans,omitempty"`
}

// OK says whether every record outside the damage was recovered and the
// damage named.
func (g GapResult) OK() bool { return g.Skipped != "" || g.Ran && g.Named && g.Recovered == g.Expected }

// UnsavedResult is the Release whose save fails.
type UnsavedResult struct {
	Skipped string `json:"skipped,omitempty"`
	// Refused: the Release failed, "not saved".
	Refused bool `json:"refused"`
	// KeptInMemory: the pod still held its devices after it.
	KeptInMemory bool `json:"kept_in_memory"`
	// KeptFromOthers: the devices stayed allocated, not free for others.
	KeptFromOthers bool `json:"kept_from_others"`
	// AllocateTakenBack: an Allocate refused meanwhile left nothing, in
	// memory nor after the restart.
	AllocateTakenBack bool `json:"allocate_taken_back"`
	// AfterCrash: after kill -9 (the disk working again), the pod held
	// the same devices.
	AfterCrash bool `json:"after_crash"`
	// RetrySaved: the Release retried once the disk worked freed them,
	// and a kill -9 after it did not bring them back.
	RetrySaved bool   `json:"retry_saved"`
	Note       string `json:"note,omitempty"`
}

// OK says whether memory and disk agreed at every step.
func (u UnsavedResult) OK() bool {
	return u.Skipped != "" || u.Refused && u.KeptInMemory && u.KeptFromOthers && u.AllocateTakenBack && u.AfterCrash && u.RetrySaved
}

// journalPhase runs both scenarios.
func (h *harness) journalPhase(ctx context.Context) error {
	if !h.cfg.Journal {
		return nil
	}
	h.logf("journal: a sector zeroed inside record 2 of 10; a Release whose save fails")
	g, err := h.gapScenario(ctx)
	h.mu.Lock()
	h.res.Journal.Gap = g
	h.mu.Unlock()
	h.logf("  gap: ran=%v named=%v recovered %d of %d, lost %v %s", g.Ran, g.Named, g.Recovered, g.Expected, g.Lost, g.Skipped)
	if err != nil {
		return fmt.Errorf("journal gap: %w", err)
	}
	u, err := h.unsavedScenario(ctx)
	h.mu.Lock()
	h.res.Journal.Unsaved = u
	h.mu.Unlock()
	h.logf("  unsaved release: %+v", u)
	if err != nil {
		return fmt.Errorf("journal unsaved release: %w", err)
	}
	return nil
}

// gapPod names the scenario's pods: new names for each attempt, since the
// harness's ledger keeps a released pod released for good.
func (h *harness) gapPod(i int) string { return fmt.Sprintf("jgap-%d-%d", h.gapRound, i) }

// gapRecords makes ten changes, each its own record, after a fresh start
// of the devicemanager (its journal then holds only them and the
// registrations): five allocations, the release of the first, four more.
func (h *harness) gapRecords(ctx context.Context, resources []string) error {
	for i := 1; i <= 9; i++ {
		if i == 6 && !h.release(ctx, h.gapPod(1)) {
			return errors.New("release of " + h.gapPod(1) + " not acknowledged")
		}
		if _, err := h.allocate(ctx, h.gapPod(i), resources[i%len(resources)], 1); err != nil {
			return fmt.Errorf("allocate %s: %w", h.gapPod(i), err)
		}
	}
	return nil
}

var podInRecord = regexp.MustCompile(`"pod_uid":"(jgap-\d+-\d+)"`)

// gapRecord is one of the scenario's records in the journal.
type gapRecord struct {
	from, to int
	pod      string
	release  bool
}

// scenarioRecords returns the scenario's records in the journal b.
func scenarioRecords(b []byte) []gapRecord {
	var out []gapRecord
	for _, f := range frames(b) {
		p := b[f[0]+frameHeader : f[0]+f[1]]
		if m := podInRecord.FindSubmatch(p); m != nil {
			out = append(out, gapRecord{from: f[0], to: f[0] + f[1], pod: string(m[1]), release: strings.Contains(string(p), `"removed_allocations"`)})
		}
	}
	return out
}

// gapScenario zeros the sector in the middle of the scenario's second
// record, restarts the devicemanager, and checks what it recovered and
// named. A compaction that moved the records to a new journal spoils an
// attempt; it is tried again, up to three times.
func (h *harness) gapScenario(ctx context.Context) (GapResult, error) {
	rs := h.stableResources()
	if len(rs) == 0 {
		return GapResult{Skipped: "no stable resource"}, nil
	}
	var g GapResult
	for range 3 {
		var err error
		if g, err = h.gapAttempt(ctx, rs); err != nil || g.Skipped == "" {
			return g, err
		}
		if _, err := h.converge(ctx, "journal gap: attempt spoilt", "devicemanager"); err != nil {
			return g, err
		}
		if err := h.releaseAll(ctx, h.gapPods()); err != nil {
			return g, err
		}
	}
	return g, nil
}

// gapPods are the scenario's pods of the current attempt.
func (h *harness) gapPods() []string {
	pods := make([]string, 0, 9)
	for i := 1; i <= 9; i++ {
		pods = append(pods, h.gapPod(i))
	}
	return pods
}

// gapAttempt is one attempt of gapScenario.
func (h *harness) gapAttempt(ctx context.Context, rs []string) (GapResult, error) {
	var g GapResult
	h.gapRound++
	if err := h.killRestart(ctx, "devicemanager"); err != nil {
		return g, err
	}
	if _, err := h.converge(ctx, "journal gap: fresh start", "devicemanager"); err != nil {
		return g, err
	}
	if err := h.gapRecords(ctx, rs); err != nil {
		return g, err
	}
	h.killDevicemanager()
	js := h.journals()
	if len(js) != 1 {
		g.Skipped = fmt.Sprintf("%d journals (a compaction cut short)", len(js))
		return g, h.st.Start(ctx, "devicemanager")
	}
	b, err := os.ReadFile(js[0])
	if err != nil {
		return g, err
	}
	recs := scenarioRecords(b)
	if len(recs) != 10 {
		g.Skipped = fmt.Sprintf("the journal holds %d of the scenario's 10 records (a compaction started a new one)", len(recs))
		return g, h.st.Start(ctx, "devicemanager")
	}
	mid := (recs[1].from + recs[1].to) / 2
	from := mid / 512 * 512
	clear(b[from : from+512])
	if err := os.WriteFile(js[0], b, 0o600); err != nil {
		return g, err
	}
	if err := h.st.Start(ctx, "devicemanager"); err != nil {
		return g, fmt.Errorf("devicemanager did not start after the damage: %w", err)
	}
	g.Ran = true
	return g, h.gapCheck(ctx, &g, recs, from, from+512)
}

// gapCheck compares what the devicemanager lists and says with the
// records outside the zeroed bytes [from, to).
func (h *harness) gapCheck(ctx context.Context, g *GapResult, recs []gapRecord, from, to int) error {
	held, lostRelease := map[string]bool{}, false
	var touched []gapRecord
	for _, r := range recs {
		if r.from < to && r.to > from {
			touched = append(touched, r)
			g.Lost = append(g.Lost, r.pod)
			lostRelease = lostRelease || r.release
			continue
		}
		held[r.pod] = !r.release
	}
	for _, ok := range held {
		if ok {
			g.Expected++
		}
	}
	g.Named, g.Spans = h.spansNamed(touched)
	s, err := h.snapshot(ctx)
	if err != nil {
		return err
	}
	for _, a := range s.Allocations {
		if held[a.Key.Pod] {
			g.Recovered++
		}
	}
	if !g.Named || g.Recovered != g.Expected {
		h.violate(Violation{Invariant: "a", When: "journal gap", Detail: fmt.Sprintf("recovered %d of %d allocations outside the damage; damage named %v: %s", g.Recovered, g.Expected, g.Named, g.Spans)})
	}
	h.forgetLost(g.Lost, lostRelease)
	if _, err := h.converge(ctx, "journal gap", "devicemanager"); err != nil {
		return err
	}
	return h.releaseAll(ctx, h.gapPods())
}

var spanBytes = regexp.MustCompile(`bytes (\d+) to (\d+)`)

// spansNamed reports whether the devicemanager's loud line names bytes
// covering every record in touched, and returns the spans it named.
func (h *harness) spansNamed(touched []gapRecord) (bool, string) {
	var spans [][2]int
	var text []string
	for _, line := range h.st.Process("devicemanager").LogLines(unusable) {
		list, _ := line["unreadable"].([]any)
		for _, s := range list {
			str, _ := s.(string)
			text = append(text, str)
			for _, m := range spanBytes.FindAllStringSubmatch(str, -1) {
				a, _ := strconv.Atoi(m[1])
				b, _ := strconv.Atoi(m[2])
				spans = append(spans, [2]int{a, b})
			}
		}
	}
	for _, r := range touched {
		if !slices.ContainsFunc(spans, func(s [2]int) bool { return s[0] <= r.from && s[1] >= r.to }) {
			return false, strings.Join(text, "; ")
		}
	}
	return len(spans) > 0, strings.Join(text, "; ")
}

// forgetLost drops from the harness's ledger what the damage took, which
// the devicemanager named: the lost pods' allocations; and, when the
// release of the first pod was lost, that release (its allocation is held
// again, as the design says a release inside the damage is).
func (h *harness) forgetLost(lost []string, lostRelease bool) {
	h.pause.Lock()
	defer h.pause.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range h.acked {
		if slices.Contains(lost, k.Pod) {
			delete(h.acked, k)
		}
	}
	if lostRelease {
		delete(h.released, h.gapPod(1))
	}
}

// immutable sets (on) or clears the immutable attribute of paths.
func immutable(on bool, paths ...string) error {
	flag := "-i"
	if on {
		flag = "+i"
	}
	out, err := exec.Command("chattr", append([]string{flag}, paths...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("chattr %s: %v: %s", flag, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// breakJournal makes the current journal and its directory immutable, so
// that the devicemanager's writes fail, and returns the undoing. It waits
// for no compaction to be in flight first.
func (h *harness) breakJournal(ctx context.Context) (undo func() error, skip string, err error) {
	for h.compacting() {
		select {
		case <-ctx.Done():
			return nil, "", ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	js := h.journals()
	if len(js) == 0 {
		return nil, "no journal", nil
	}
	paths := []string{js[len(js)-1], filepath.Dir(js[0])}
	if err := immutable(true, paths...); err != nil {
		return nil, "cannot make the journal immutable here (" + err.Error() + ")", nil
	}
	return func() error { return immutable(false, paths...) }, "", nil
}

// unsavedPod is the pod whose Release fails to save; unsavedOther asks
// for devices while the journal is broken.
const unsavedPod, unsavedOther = "junsaved-1", "junsaved-2"

// unsavedScenario breaks the journal, releases a pod, and checks that the
// Release was taken back, in memory and across a kill -9; then that its
// retry, once the disk works, frees the devices for good.
func (h *harness) unsavedScenario(ctx context.Context) (UnsavedResult, error) {
	var u UnsavedResult
	rs := h.stableResources()
	if len(rs) == 0 {
		u.Skipped = "no stable resource"
		return u, nil
	}
	if _, err := h.allocate(ctx, unsavedPod, rs[0], 1); err != nil {
		return u, fmt.Errorf("allocate %s: %w", unsavedPod, err)
	}
	devices := h.devicesOf(ctx, unsavedPod)
	undo, skip, err := h.breakJournal(ctx)
	if err != nil || skip != "" {
		u.Skipped = skip
		return u, errors.Join(err, h.releaseAll(ctx, []string{unsavedPod}))
	}
	err = h.whileBroken(ctx, &u, rs[0], devices)
	h.killDevicemanager()
	if uerr := undo(); uerr != nil {
		return u, errors.Join(err, uerr)
	}
	if err != nil {
		return u, errors.Join(err, h.st.Start(ctx, "devicemanager"))
	}
	if err := h.st.Start(ctx, "devicemanager"); err != nil {
		return u, fmt.Errorf("devicemanager did not start after the disk worked again: %w", err)
	}
	u.AfterCrash = slices.Equal(h.devicesOf(ctx, unsavedPod), devices)
	u.AllocateTakenBack = u.AllocateTakenBack && len(h.devicesOf(ctx, unsavedOther)) == 0
	if err := h.retrySaved(ctx, &u); err != nil {
		return u, err
	}
	if !u.OK() {
		h.violate(Violation{Invariant: "a", When: "journal unsaved release", Detail: fmt.Sprintf("memory and disk disagree: %+v", u)})
	}
	_, err = h.converge(ctx, "journal unsaved release", "devicemanager")
	return u, err
}

// whileBroken releases the pod and allocates for another while the
// journal cannot be written, and checks both were taken back in memory.
func (h *harness) whileBroken(ctx context.Context, u *UnsavedResult, resource string, devices []string) error {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := h.dm.Release(rctx, &dmv1.ReleaseRequest{PodUid: unsavedPod})
	u.Refused = err != nil && strings.Contains(err.Error(), "not saved")
	if !u.Refused {
		u.Note = fmt.Sprintf("Release with the journal immutable: %v", err)
		return nil
	}
	u.KeptInMemory = len(devices) > 0 && slices.Equal(h.devicesOf(ctx, unsavedPod), devices)
	_, err = h.dm.Allocate(rctx, &dmv1.AllocateRequest{PodUid: unsavedOther, ContainerName: "c",
		Resources: []*dmv1.ResourceRequest{{ResourceName: resource, Count: 1}}})
	u.AllocateTakenBack = err != nil && len(h.devicesOf(ctx, unsavedOther)) == 0
	lr, err := h.dm.ListResources(rctx, &dmv1.ListResourcesRequest{})
	if err != nil {
		return err
	}
	for _, r := range lr.GetResources() {
		if r.GetName() == resource {
			u.KeptFromOthers = len(devices) > 0 && !slices.ContainsFunc(devices, func(d string) bool { return !slices.Contains(r.GetAllocatedDeviceIds(), d) })
		}
	}
	return nil
}

// retrySaved retries the Release with the disk working, kills the
// devicemanager, and checks that the pod stays released.
func (h *harness) retrySaved(ctx context.Context, u *UnsavedResult) error {
	if err := h.releaseAll(ctx, []string{unsavedPod, unsavedOther}); err != nil {
		return err
	}
	if err := h.killRestart(ctx, "devicemanager"); err != nil {
		return err
	}
	u.RetrySaved = len(h.devicesOf(ctx, unsavedPod)) == 0
	return nil
}

// devicesOf returns the devices pod holds, as the devicemanager lists
// them (nil when it cannot be asked).
func (h *harness) devicesOf(ctx context.Context, pod string) []string {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l, err := h.dm.ListAllocations(lctx, &dmv1.ListAllocationsRequest{PodUid: pod})
	if err != nil {
		return nil
	}
	var out []string
	for _, a := range l.GetAllocations() {
		out = append(out, a.GetDeviceIds()...)
	}
	slices.Sort(out)
	return out
}

// killDevicemanager SIGKILLs the devicemanager, counted, to be started
// again by the caller.
func (h *harness) killDevicemanager() {
	h.mu.Lock()
	h.window = "devicemanager"
	h.res.Kills["devicemanager"]++
	h.mu.Unlock()
	h.st.Kill("devicemanager")
}
