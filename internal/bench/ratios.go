package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// The ratios' names (see ComputeRatios). Every ratio is lower-is-better.
const (
	// RatioRSSStart is the devicemanager's VmRSS before any plugin
	// registered over rssReferenceMiB: the target is 1.2.
	RatioRSSStart = "rss/devicemanager_start"
	// RatioRSSStartAnon is its RssAnon, its own memory without the
	// file-backed pages of its executable, over the same reference.
	RatioRSSStartAnon = "rss/devicemanager_start_anon"
)

// rssReferenceMiB is what the devicemanager's RSS at start is divided by:
// about what it was before DRA claims, its VmRSS at start on 2026-12-01
// (16.7–17.1 MiB measured again on a 2-core machine on 2026-12-03, the
// "about 20 MB" of the issue that set the target of 1.2×). Changing it
// changes the ratios of every run, so a baseline must be written again
// when it changes.
const rssReferenceMiB = 20

// cpuRatioMinN is the least N whose CPU figures make a ratio and are
// shown: below it a round's CPU is mostly the burst's fixed costs, not
// the registrations'.
const cpuRatioMinN = 100

// kubeletRatioMinN is the least N compared with the kubelet: below it the
// kubelet's figures are its reconciler's one-second pass, and nodeplug's
// few milliseconds over it swing by more than the comparison's margin from
// run to run.
const kubeletRatioMinN = 100

// ComputeRatios returns r's figures as named ratios, all lower-is-better:
//
//   - floor/<kind>/n=<N>/total and .../p99: nodeplug over the floor
//     registrar for N plugins of a kind at once (FloorResult.RatioTotal and
//     RatioP99), <kind> being "device-plugin" or "dra";
//   - cpu/<kind>/n=<N>/over_contract, for N ≥ 100: nodeplug's CPU per
//     plugin over the contract floor's, the median over the rounds;
//   - kubelet/<kind>/n=<N>/total and .../p99, for N ≥ 100 when the
//     kubelet ran: nodeplug over the kubelet (below 1, nodeplug is faster);
//   - rss/devicemanager_start: the devicemanager's VmRSS before any plugin
//     registered, over a fixed reference of 20 MiB (target 1.2);
//   - rss/devicemanager_start_anon: its RssAnon, over the same reference.
//
// A phase that did not run gives no ratio, and neither does a figure that is
// zero (not measured, or a CPU time below the kernel's tick).
func ComputeRatios(r *Results) map[string]float64 {
	out := map[string]float64{}
	put := func(name string, v float64) {
		if v > 0 {
			out[name] = v
		}
	}
	for _, f := range r.Floor {
		prefix := fmt.Sprintf("%s/n=%d/", kindSlug(f.Kind), f.N)
		put("floor/"+prefix+"total", f.RatioTotal)
		put("floor/"+prefix+"p99", f.RatioP99)
		if f.N >= cpuRatioMinN {
			put("cpu/"+prefix+"over_contract", cpuOverContract(f.Rounds))
		}
		if f.N >= kubeletRatioMinN {
			put("kubelet/"+prefix+"total", f.KubeletRatioTotal)
			put("kubelet/"+prefix+"p99", f.KubeletRatioP99)
		}
	}
	put(RatioRSSStart, ratio(r.Footprint.DeviceManagerStartMiB, rssReferenceMiB))
	put(RatioRSSStartAnon, ratio(r.Footprint.DeviceManagerStartAnonMiB, rssReferenceMiB))
	return out
}

// kindSlug is a plugin kind as a ratio's name has it: lower case, spaces as
// dashes ("device plugin" → "device-plugin", "DRA" → "dra").
func kindSlug(kind string) string {
	return strings.ReplaceAll(strings.ToLower(kind), " ", "-")
}

// cpuOverContract is the median over rounds of nodeplug's CPU per plugin
// over the contract floor's. A round in which either measured none (its
// processes' CPU could not be read) is left out; zero when every round is.
func cpuOverContract(rounds []FloorRound) float64 {
	var v []float64
	for _, rd := range rounds {
		if rd.Nodeplug.CPUmsPerPlugin > 0 && rd.Contract.CPUmsPerPlugin > 0 {
			v = append(v, ratio(rd.Nodeplug.CPUmsPerPlugin, rd.Contract.CPUmsPerPlugin))
		}
	}
	return median(v)
}

// target is what a ratio must be to meet its goal: at most Max, or below
// it when Below.
type target struct {
	Max   float64
	Below bool
}

// Met reports whether v meets t.
func (t target) Met(v float64) bool {
	if t.Below {
		return v < t.Max
	}
	return v <= t.Max
}

func (t target) String() string {
	if t.Below {
		return fmt.Sprintf("< %.1f×", t.Max)
	}
	return fmt.Sprintf("≤ %.1f×", t.Max)
}

// cpuTarget is nodeplug's CPU per plugin over the contract floor's that
// the registration targets allow.
const cpuTarget = 1.5

// ratioTarget returns the target of the ratio named name, if it has one:
// nodeplug over the floor at most floorTargets[kind]; its CPU per plugin
// at most 1.5× the contract floor's; below the kubelet; the
// devicemanager's VmRSS at start at most 1.2× the reference.
func ratioTarget(name string) (target, bool) {
	parts := strings.Split(name, "/")
	switch {
	case name == RatioRSSStart:
		return target{Max: 1.2}, true
	case len(parts) != 4:
		return target{}, false
	case parts[0] == "floor":
		for kind, limit := range floorTargets {
			if kindSlug(kind) == parts[1] {
				return target{Max: limit}, true
			}
		}
	case parts[0] == "cpu":
		return target{Max: cpuTarget}, true
	case parts[0] == "kubelet":
		return target{Max: 1, Below: true}, true
	}
	return target{}, false
}

// printRatios writes r.Ratios, by name, each with its target and whether
// it is met, the memory figures beside the RSS ratio, then the ratios that
// miss their targets.
func printRatios(w io.Writer, r *Results) {
	fmt.Fprintln(w, "\nRatios (lower is better)")
	names := make([]string, 0, len(r.Ratios))
	width := 0
	for n := range r.Ratios {
		names = append(names, n)
		width = max(width, len(n))
	}
	sort.Strings(names)
	var missed []string
	withTarget := 0
	for _, n := range names {
		v := r.Ratios[n]
		fmt.Fprintf(w, "  %-*s %7.2f×", width, n, v)
		if t, ok := ratioTarget(n); ok {
			withTarget++
			verdict := "met"
			if !t.Met(v) {
				verdict = "MISSED"
				missed = append(missed, n)
			}
			fmt.Fprintf(w, "  target %-6s %-6s", t, verdict)
		}
		f := r.Footprint
		switch n {
		case RatioRSSStart:
			fmt.Fprintf(w, "  (VmRSS %.1f MiB over %d MiB; of it RssFile %.1f MiB, file-backed pages of its executable)",
				f.DeviceManagerStartMiB, rssReferenceMiB, f.DeviceManagerStartFileMiB)
		case RatioRSSStartAnon:
			fmt.Fprintf(w, "  (RssAnon %.1f MiB over %d MiB: its own memory)", f.DeviceManagerStartAnonMiB, rssReferenceMiB)
		}
		fmt.Fprintln(w)
	}
	if withTarget > 0 {
		fmt.Fprintf(w, "  targets met: %d of %d", withTarget-len(missed), withTarget)
		if len(missed) > 0 {
			fmt.Fprintf(w, "; missed: %s", strings.Join(missed, ", "))
		}
		fmt.Fprintln(w)
	}
}
