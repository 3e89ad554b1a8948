package bench

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Print writes the results as a table.
func Print(w io.Writer, r *Results) {
	fmt.Fprintf(w, "nodeplug-bench  %s  %d CPUs  %s", r.Machine.Time, r.Machine.CPUs, r.Machine.GoVersion)
	if r.Machine.HarnessGCPercent > 0 {
		fmt.Fprintf(w, "  (the bench's own GC at %d%% in the allocation phases)", r.Machine.HarnessGCPercent)
	}
	fmt.Fprint(w, "\n\n")
	if len(r.Registration) > 0 {
		fmt.Fprintln(w, "Registration: N listening device plugin sockets moved into plugins_registry at once;")
		fmt.Fprintln(w, "socket appears → NotifyRegistrationStatus(true) at the plugin; → allocatable in the devicemanager")
	}
	for _, rr := range r.Registration {
		fmt.Fprintf(w, "  N=%-5d notify       %s\n", rr.N, rr.Notify)
		fmt.Fprintf(w, "  N=%-5d allocatable  %s\n", rr.N, rr.Allocatable)
		fmt.Fprintf(w, "  N=%-5d all registered in %.1f ms (sockets appeared within %.1f ms); CPU used: watcher %.0f ms, reconciler %.0f ms, devicemanager %.0f ms, dramanager %.0f ms\n",
			rr.N, rr.AllRegisteredMs, rr.AppearMs, rr.CPUms["watcher"], rr.CPUms["reconciler"], rr.CPUms["devicemanager"], rr.CPUms["dramanager"])
		fmt.Fprintf(w, "  N=%-5d deregistration %s\n", rr.N, rr.Deregistration)
	}
	if len(r.Floor) > 0 {
		fmt.Fprintln(w, "\nRegistration at the floor: N plugins at once, nodeplug against the least any registrar can do")
		fmt.Fprintln(w, "(in-process fsnotify → fresh connection → GetInfo → for device plugins GetDevicePluginOptions and the first")
		fmt.Fprintln(w, "ListAndWatch answer → Notify); socket appears → NotifyRegistrationStatus(true); ratios nodeplug/floor, median of rounds")
		for _, f := range r.Floor {
			np, fl := f.median(func(rd FloorRound) RoundFigures { return rd.Nodeplug }), f.median(func(rd FloorRound) RoundFigures { return rd.Floor })
			fmt.Fprintf(w, "  %-13s N=%-5d nodeplug p50 %7.1f  p99 %7.1f  total %7.1f ms | floor p50 %7.1f  p99 %7.1f  total %7.1f ms | ratio p50 %.2f×  p99 %.2f×  total %.2f× (target ≤ %.1f×)\n",
				f.Kind, f.N, np.Notify.P50, np.Notify.P99, np.TotalMs, fl.Notify.P50, fl.Notify.P99, fl.TotalMs,
				f.RatioP50, f.RatioP99, f.RatioTotal, floorTargets[f.Kind])
		}
		fmt.Fprintln(w, "Contract floor: the least a registrar split as DESIGN splits nodeplug can do (watcher, reconciler and devicemanager")
		fmt.Fprintln(w, "processes, their gRPC contracts and a durable registration, nothing else); the total's ratio split in two")
		for _, f := range r.Floor {
			np, cf := f.median(func(rd FloorRound) RoundFigures { return rd.Nodeplug }), f.median(func(rd FloorRound) RoundFigures { return rd.Contract })
			cpu := ""
			if f.N >= cpuRatioMinN {
				cpu = fmt.Sprintf(" | CPU per plugin: nodeplug %.2f ms, contract floor %.2f ms", np.CPUmsPerPlugin, cf.CPUmsPerPlugin)
			}
			fmt.Fprintf(w, "  %-13s N=%-5d contract floor p50 %7.1f  p99 %7.1f  total %7.1f ms | total contract/floor %.2f×  nodeplug/contract %.2f×%s\n",
				f.Kind, f.N, cf.Notify.P50, cf.Notify.P99, cf.TotalMs, f.ContractRatioTotal, f.OverheadRatioTotal, cpu)
			if f.N >= cpuRatioMinN && (len(np.CPUmsPerPluginByProcess) > 0 || len(cf.CPUmsPerPluginByProcess) > 0) {
				fmt.Fprintf(w, "  %-13s N=%-5d CPU per plugin by process, ms: nodeplug %s | contract floor %s\n",
					"", f.N, byProcess(np.CPUmsPerPluginByProcess), byProcess(cf.CPUmsPerPluginByProcess))
			}
		}
		printFloorAlone(w, r.Floor)
	}
	PrintKubelet(w, r)
	// A phase that did not run leaves its figures zero: its section is
	// left out.
	if st := r.Stale; st.Stale > 0 {
		printStale(w, st)
	}
	if c := r.Churn; c.Workers > 0 {
		printChurn(w, c)
	}
	if len(r.Allocation) > 0 {
		fmt.Fprintln(w, "\nAllocation (Allocate, durable in the checkpoint journal, then Release)")
		for _, a := range r.Allocation {
			fmt.Fprintf(w, "  devices=%-6d callers=%d  %6.0f pairs/s  allocate %s\n", a.Devices, a.Callers, a.PairsPerSec, a.Allocate)
		}
	}
	if r.Durability.FsyncFloor.Count > 0 {
		printDurability(w, r.Durability)
	}
	if r.Propagation.Devices > 0 {
		fmt.Fprintf(w, "\nHealth flip → WatchResources (%d devices)\n  %s\n", r.Propagation.Devices, r.Propagation.Latency)
	}
	if len(r.Claims) > 0 {
		fmt.Fprintln(w, "\nDRA claims (PrepareResources of a new claim: allocated, NodePrepareResources of an in-process driver, durable; then Release)")
		for _, c := range r.Claims {
			fmt.Fprintf(w, "  callers=%d  %6.0f pairs/s  prepare %s\n    driver's NodePrepareResources %s  prepare p99 / driver p99 %.2f×\n",
				c.Callers, c.PairsPerSec, c.Prepare, c.DriverPrepare, c.PrepareP99OverDriver)
		}
	}
	if f := r.Footprint; len(f.RSSMiB) > 0 {
		printFootprint(w, f)
	}
	if len(r.Ratios) > 0 {
		printRatios(w, r)
	}
}

func printStale(w io.Writer, st StaleResult) {
	fmt.Fprintf(w, "\nRegistration beside %d stale sockets (files that refuse connections), one healthy device plugin at a time;\n", st.Stale)
	fmt.Fprintln(w, "socket listen → NotifyRegistrationStatus(true), quiet and beside them in the same run")
	fmt.Fprintf(w, "  quiet         %s\n", st.Quiet)
	fmt.Fprintf(w, "  beside stale  %s\n", st.BesideStale)
	fmt.Fprintf(w, "  ratio p50 %.2f×  p99 %.2f×  (target ≤ %.0f×)\n", st.RatioP50, st.RatioP99, staleRatioTarget)
}

func printChurn(w io.Writer, c ChurnResult) {
	fmt.Fprintf(w, "\nChurn (%d workers, %.1f s, %d resident)\n", c.Workers, c.Seconds, c.Resident)
	fmt.Fprintf(w, "  %d create/remove cycles, %.1f/s\n  register   %s\n  deregister %s\n  final state exact: %v %s\n",
		c.Cycles, c.CyclesPerSec, c.Register, c.Deregister, c.FinalExact, c.FinalProblem)
}

func printFootprint(w io.Writer, f FootprintResult) {
	fmt.Fprintf(w, "\nFootprint with %d registration-only plugins\n", f.IdlePlugins)
	fmt.Fprintf(w, "  devicemanager before any plugin: VmRSS %.1f MiB = RssAnon %.1f MiB (its own) + RssFile %.1f MiB (file-backed, mostly its executable)\n",
		f.DeviceManagerStartMiB, f.DeviceManagerStartAnonMiB, f.DeviceManagerStartFileMiB)
	names := make([]string, 0, len(f.RSSMiB))
	for n := range f.RSSMiB {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-14s RSS %6.1f MiB  idle CPU %5.2f %% of a core\n", n, f.RSSMiB[n], f.IdleCPUPercent[n])
	}
	fmt.Fprintf(w, "  devicemanager with %d device plugins: %.1f → %.1f MiB (%.1f KiB per plugin); before them RssAnon %.1f MiB, RssFile %.1f MiB\n",
		f.DeviceManagerPlugins, f.DeviceManagerBaseMiB, f.DeviceManagerLoadedMiB, f.DeviceManagerPerPlugin, f.DeviceManagerBaseAnonMiB, f.DeviceManagerBaseFileMiB)
	fmt.Fprintf(w, "  bare grpc-go client, one connection and one ListAndWatch stream per plugin: %.1f KiB, %.2f goroutines per connection; devicemanager / bare %.2f× (target ≤ 1.1×)\n",
		f.Bare.KiBPerConn, f.Bare.GoroutinesPer, f.DeviceManagerOverBare)
	fmt.Fprintf(w, "  devicemanager once they left: %.1f MiB, %.2f× its RSS before them (target ≤ 1.2×)\n", f.DeviceManagerAfterMiB, f.DeviceManagerAfterOverBase)
	if f.Bare.RSSKiBClosed > 0 {
		fmt.Fprintf(w, "  bare grpc-go client once it closed them: %.1f MiB, %.2f× its RSS before them (%d goroutines left; %.1f MiB kept, the devicemanager %.1f MiB)\n",
			f.Bare.RSSKiBClosed/1024, f.Bare.ClosedOverBefore, f.Bare.GoroutinesClosed,
			(f.Bare.RSSKiBClosed-f.Bare.RSSKiBBefore)/1024, f.DeviceManagerAfterMiB-f.DeviceManagerBaseMiB)
	}
}

// printFloorAlone prints the floor registrar's figures in a process of its
// own beside the floor's in the plugins' process, and nodeplug's CPU over
// its CPU.
func printFloorAlone(w io.Writer, floor []FloorResult) {
	fmt.Fprintln(w, "Floor alone: the floor registrar in a process of its own, apart from the plugins as any registrar is; its CPU is")
	fmt.Fprintln(w, "the least CPU a registrar spends on a registration")
	for _, f := range floor {
		fa := f.median(func(rd FloorRound) RoundFigures { return rd.FloorAlone })
		cpu := ""
		if f.N >= cpuRatioMinN {
			np := f.median(func(rd FloorRound) RoundFigures { return rd.Nodeplug })
			cpu = fmt.Sprintf(" | CPU per plugin: floor alone %.2f ms, nodeplug %.2f ms, nodeplug/floor alone %.2f×", fa.CPUmsPerPlugin, np.CPUmsPerPlugin, f.CPUOverAlone)
		}
		fmt.Fprintf(w, "  %-13s N=%-5d floor alone p50 %7.1f  p99 %7.1f  total %7.1f ms | total floor alone/floor %.2f×%s\n",
			f.Kind, f.N, fa.Notify.P50, fa.Notify.P99, fa.TotalMs, f.AloneRatioTotal, cpu)
	}
}

// processOrder is the order byProcess names processes in: registration's
// path through nodeplug's services (and the contract floor's roles), then
// any other in name order.
var processOrder = []string{"watcher", "reconciler", "devicemanager", "dramanager", "apiserver"}

// byProcess formats CPU per plugin by process, in ms: "watcher 0.05,
// reconciler 0.61, …", or "-" when there is none.
func byProcess(m map[string]float64) string {
	if len(m) == 0 {
		return "-"
	}
	rank := func(n string) int {
		if i := slices.Index(processOrder, n); i >= 0 {
			return i
		}
		return len(processOrder)
	}
	names := slices.SortedFunc(maps.Keys(m), func(a, b string) int {
		return cmp.Or(cmp.Compare(rank(a), rank(b)), strings.Compare(a, b))
	})
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("%s %.2f", n, m[n]))
	}
	return strings.Join(parts, ", ")
}
