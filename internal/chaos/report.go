package chaos

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/nodeplug/nodeplug/internal/stack"
)

// Print writes the results as a table.
func Print(w io.Writer, r *Results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	var kills []string
	total := 0
	for _, s := range stack.Services {
		kills = append(kills, fmt.Sprintf("%s %d", s, r.Kills[s]))
		total += r.Kills[s]
	}
	fmt.Fprintf(tw, "run\t%.0f s, %d CPUs, %s\n", r.Seconds, r.Machine.CPUs, r.Machine.GoVersion)
	fmt.Fprintf(tw, "plugins\t%d (both registration paths), %d churned\n", r.Plugins, r.Churned)
	fmt.Fprintf(tw, "SIGKILLs\t%d (%s), %d of them mid-burst (devicemanager)\n", total, strings.Join(kills, ", "), r.BurstKills)
	fmt.Fprintf(tw, "  during a compaction\t%d of the devicemanager kills left a compaction cut short; of the %d kills of the compaction phase, %d did (%d aimed, at least 1 needed)\n",
		r.MidCompaction, r.CompactionKills, r.CompactionLanded, r.CompactionAimed)
	fmt.Fprintf(tw, "allocations\t%d acknowledged, %d released, %d answers cut off by kills (%d mid-burst)\n", r.Acked, r.Released, r.Uncertain, r.BurstUncertain)
	fmt.Fprintf(tw, "checks\t%d\n", r.Checks)
	fmt.Fprintf(tw, "restart (ms)\tp50 %.1f  p99 %.1f  max %.1f\n", r.Restart.P50, r.Restart.P99, r.Restart.Max)
	fmt.Fprintf(tw, "converge after a restart (ms)\tp50 %.1f  p99 %.1f  max %.1f  (n=%d)\n", r.Converge.P50, r.Converge.P99, r.Converge.Max, r.Converge.Count)
	for _, s := range stack.Services {
		if d, ok := r.ConvergeBy[s]; ok {
			fmt.Fprintf(tw, "  after %s\tp50 %.1f  p99 %.1f  max %.1f  (n=%d)\n", s, d.P50, d.P99, d.Max, d.Count)
		}
	}
	fmt.Fprintf(tw, "convergences over %v\t%d\n", SlowConverge, len(r.Slow))
	fmt.Fprintf(tw, "dips across devicemanager restarts\t%d (not counted as violations)\n", r.DMDips)
	if r.DRA.Drivers > 0 {
		fmt.Fprintf(tw, "DRA\t%d drivers, %d kills while they publish (apiserver and devicemanager in turn): %d slice writes acknowledged, %d cut off, %d conflicts after them, %d checks\n",
			r.DRA.Drivers, r.DRA.Kills, r.DRA.Acked, r.DRA.Uncertain, r.DRA.Conflicts, r.DRA.Checks)
	}
	if c := r.Claims; c.Workers > 0 {
		fmt.Fprintf(tw, "DRA claims\t%d clients, %d devicemanager kills: %d prepares and %d releases acknowledged (%d shared claims), %d calls retried; the driver prepared %d, unprepared %d; %d checks\n",
			c.Workers, c.Kills, c.Prepares, c.Releases, c.Shared, c.Retried, c.DriverPrepares, c.DriverUnprepares, c.Checks)
	}
	if c := r.Pods; c.Workers > 0 {
		fmt.Fprintf(tw, "pods\t%d clients, %d kills (dramanager and apiserver in turn): %d pods run from a template's claim, %d deleted with nothing left, %d calls retried; the driver prepared %d, unprepared %d\n",
			c.Workers, c.Kills, c.Run, c.Deleted, c.Retried, c.DriverPrepares, c.DriverUnprepares)
	}
	if len(r.Intents.Steps) > 0 {
		steps := make([]string, 0, len(r.Intents.Steps))
		for _, st := range r.Intents.Steps {
			steps = append(steps, st.Step+" → "+st.Outcome)
		}
		fmt.Fprintf(tw, "DRA intents (l)\tkilled at %d steps of a prepare and a release: %s\n", len(steps), strings.Join(steps, ", "))
	}
	printJournal(tw, r.Journal)
	for _, inv := range []string{"a", "b", "c", "d", invSliceLost, invRVBackward, invClaimTwice, invClaimLeft, invDeviceTwice, invClaimEarlyOff, invSpecs, invStranded, invPodRun, invPodLeft} {
		fmt.Fprintf(tw, "violations (%s)\t%d\n", inv, r.ViolationsN[inv])
	}
	tw.Flush()
	if len(r.Faults) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "checkpoint fault\tstarted\tloud log\tmoved aside\tconverged\tallocations before→after\tnote")
		for _, f := range r.Faults {
			note := f.Skipped + f.Note
			if f.Skipped != "" {
				note = "skipped: " + note
			}
			fmt.Fprintf(tw, "%s\t%v\t%v\t%v\t%v\t%d→%d\t%s\n", f.Kind, f.Started, f.Loud, f.MovedAside != "", f.Converged, f.AllocationsBefore, f.AllocationsAfter, note)
		}
		tw.Flush()
	}
	if len(r.Slow) > 0 {
		fmt.Fprintln(w)
		for _, c := range r.Slow {
			fmt.Fprintf(w, "slow: %s: %.0f ms; first %s; last %s\n", c.When, c.Ms, c.FirstSeen, c.WaitingFor)
		}
	}
	if len(r.Violations) > 0 {
		fmt.Fprintln(w)
		vs := append([]Violation(nil), r.Violations...)
		sort.SliceStable(vs, func(i, j int) bool { return vs[i].Invariant < vs[j].Invariant })
		for _, v := range vs {
			fmt.Fprintln(w, "VIOLATION", v)
		}
	}
}

// printJournal prints the journal phase: the damage inside the journal and
// the Release whose save failed.
func printJournal(tw io.Writer, j JournalResults) {
	switch g := j.Gap; {
	case g.Skipped != "":
		fmt.Fprintf(tw, "journal damaged inside\tskipped: %s\n", g.Skipped)
	case g.Ran:
		fmt.Fprintf(tw, "journal damaged inside\t%d of %d records outside the damage recovered, span named %v (%s), pods lost %v\n",
			g.Recovered, g.Expected, g.Named, g.Spans, g.Lost)
	}
	switch u := j.Unsaved; {
	case u.Skipped != "":
		fmt.Fprintf(tw, "release not saved\tskipped: %s\n", u.Skipped)
	default:
		fmt.Fprintf(tw, "release not saved\trefused %v, kept in memory %v and from others %v, allocate taken back %v, after kill -9 %v, retry saved %v\n",
			u.Refused, u.KeptInMemory, u.KeptFromOthers, u.AllocateTakenBack, u.AfterCrash, u.RetrySaved)
	}
}
