// Command nodeplug-bench measures nodeplug with real processes and real
// plugins: registration and deregistration latency, churn, allocation
// throughput, device update propagation and footprint. It prints a table,
// writes the figures as JSON and compares the run's ratios with a baseline
// (bench/baseline.json by default; -write-baseline records a new one).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodeplug/nodeplug/internal/bench"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/version"
)

func main() {
	os.Exit(run())
}

// run runs what the command line asks for and returns the exit code: 2
// for a usage error, 1 for a failure, 3 for a ratio worse than the
// baseline's with -fail-on-regression.
func run() int {
	o := parseFlags()
	if o.bareClient != "" {
		return runBareClient(o.bareClient)
	}
	if o.contractFloor != "" {
		return runContractFloor(o.contractFloor, flag.Args())
	}
	if o.showVersion {
		fmt.Println("nodeplug-bench", version.Version)
		return 0
	}
	if o.baselineFrom != "" {
		return mergeBaseline(o)
	}
	cfg, err := o.config()
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
		return 2
	}
	if cfg.Bin, err = stack.BinDir(cfg.Bin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if o.scenario != "" {
		return runScenario(o.scenario, cfg.Bin, cfg.Root, o.short)
	}

	// Read before the run, so that a bad baseline file does not waste it.
	base, err := bench.LoadBaseline(o.baseline, o.baselineSet)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
		return 1
	}
	return runBench(cfg, o, base)
}

// options is the command line.
type options struct {
	short, showVersion, apiTCP             bool
	bin, out, root, phases, regN, pprofDir string
	scenario, bareClient, contractFloor    string
	baseline, writeBaseline, baselineFrom  string
	markdown                               string
	kubeletHarness, kinds                  string
	baselineSet, failOnRegression          bool // baselineSet: -baseline was given
	floorRounds, harnessGC, pprofSecs      int
	journalLoop                            time.Duration
	clientTLS                              *app.TLS
	tcp                                    bench.APITCP
}

// parseFlags defines the flags on flag.CommandLine and parses the command
// line.
func parseFlags() *options {
	o := &options{}
	flag.BoolVar(&o.short, "short", false, "a quick run that still produces every figure")
	flag.StringVar(&o.bin, "bin", "", "directory with nodeplug-watcher, -reconciler and -devicemanager (default: this binary's directory)")
	flag.StringVar(&o.out, "json", "bench-results.json", "write the figures here as JSON (empty: don't)")
	flag.StringVar(&o.markdown, "markdown", "", "also write the table as a Markdown page here, with the date, the machine, the source and the command (make figures: docs/figures/bench.md)")
	flag.StringVar(&o.root, "root-dir", "", "root dir for the services (default: a temporary directory)")
	flag.StringVar(&o.phases, "phases", "", "comma-separated phases to run, of "+strings.Join(bench.Phases, ",")+" (default: all)")
	flag.StringVar(&o.regN, "registration-n", "", "comma-separated plugin counts of the registration rounds (default: 1,10,100,1000; -short: 1,10)")
	flag.StringVar(&o.kinds, "kinds", "", "comma-separated plugin kinds of the floor phase, of device-plugin,dra (default: both)")
	flag.StringVar(&o.kubeletHarness, "kubelet-harness", "", "the kubeletreg binary (make kubeletreg): the floor phase's rounds measure the kubelet's own plugin manager too; needs root "+
		"(default: kubeletreg in the -bin directory when it is there and the bench runs as root; off: don't)")
	flag.IntVar(&o.floorRounds, "floor-rounds", 0, "rounds of nodeplug, the floor and the contract floor per kind and N in the floor phase, their median reported (default 10; -short: 1); at N ≤ 100 one round's CPU is a tenth of a second, which one collection or the page faults after a give-back swing by half, and more rounds steady the median")
	flag.DurationVar(&o.journalLoop, "journal-loop", 0, "how long the durability phase's Allocate/Release loop follows the journal's size (default: 1m; -short: 1s)")
	flag.IntVar(&o.harnessGC, "harness-gc-percent", bench.DefaultHarnessGCPercent, "the bench process's own GC percent during the allocation and durability phases, whose callers and in-process plugins it hosts (0: Go's default)")
	flag.StringVar(&o.pprofDir, "pprof", "", "write a CPU profile of each service, taken over the measured phases' first -pprof-seconds, into this directory, and one of each contract floor process over its life")
	flag.IntVar(&o.pprofSecs, "pprof-seconds", 20, "how long the -pprof profiles run")
	flag.StringVar(&o.baseline, "baseline", bench.DefaultBaselineFile, "compare the run's ratios with this baseline file and report those more than 25% worse (empty: don't; the default is skipped when absent)")
	flag.StringVar(&o.writeBaseline, "write-baseline", "", "write the run's ratios to this file as a new baseline, with the date and the machine")
	flag.StringVar(&o.baselineFrom, "baseline-from", "", "with -write-baseline and instead of a run: comma-separated figures files of earlier runs (their -json), at least two; "+
		"the baseline records each ratio's median over them and its range, and a later run reports a ratio only when it is both more than 25% worse than the median and worse than every one of these runs")
	flag.BoolVar(&o.failOnRegression, "fail-on-regression", false, "exit with status 3 when a ratio is more than 25% worse than the baseline's (default: report it only)")
	flag.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	flag.StringVar(&o.scenario, "scenario", "", "run this scenario instead of the phases: "+scenarios)
	flag.BoolVar(&o.apiTCP, "api-tcp", false, "serve each service's API on a free 127.0.0.1 TCP port too (--listen-tcp) and make the bench's own API calls there, "+
		"over mutual TLS; without certificate files the bench makes a throwaway CA, a server and a client certificate (role operator) under <root-dir>/bench-tls/")
	// The client flags of nodeplugctl and the reconciler, with the same
	// names and meaning, used with -api-tcp; with certificates of one's own
	// the services' side is needed too.
	o.clientTLS = app.AddClientTLSFlags(flag.CommandLine)
	for _, name := range []string{"tls-cert-file", "tls-key-file", "tls-ca-file"} {
		f := flag.Lookup(name)
		f.Usage = "with -api-tcp: " + f.Usage + " (give all six certificate flags, or none)"
	}
	flag.Lookup("insecure-tcp").Usage = "with -api-tcp: no TLS on either side (the services get --insecure-tcp; loopback only, every caller has every role)"
	flag.StringVar(&o.tcp.ServerCertFile, "tls-server-cert-file", "", "with -api-tcp and your own client certificate: the services' --tls-cert-file, a server certificate for 127.0.0.1 signed by the -tls-ca-file CA")
	flag.StringVar(&o.tcp.ServerKeyFile, "tls-server-key-file", "", "with -api-tcp: key of -tls-server-cert-file (the services' --tls-key-file)")
	flag.StringVar(&o.tcp.ClientCAFile, "tls-client-ca-file", "", "with -api-tcp: the services' --tls-client-ca-file, the CA that signs -tls-cert-file")
	flag.StringVar(&o.bareClient, bench.BareClientFlag, "", "(internal) measure a bare grpc-go client of the device plugin endpoints listed in this file, print JSON")
	flag.StringVar(&o.contractFloor, bench.ContractFloorFlag, "", "(internal) run this role of the contract floor, with the other arguments")
	flag.Parse()
	flag.Visit(func(f *flag.Flag) { o.baselineSet = o.baselineSet || f.Name == "baseline" })
	return o
}

// config is the bench's configuration from the command line (its Bin not
// yet resolved); an error is a usage error.
func (o *options) config() (bench.Config, error) {
	cfg := bench.Default()
	if o.short {
		cfg = bench.Short()
	}
	if o.phases != "" {
		cfg.Phases = strings.Split(o.phases, ",")
		if err := bench.CheckPhases(cfg.Phases); err != nil {
			return cfg, err
		}
	}
	if o.regN != "" {
		cfg.RegistrationNs = nil
		for _, f := range strings.Split(o.regN, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				return cfg, fmt.Errorf("-registration-n: %q is not a positive count", f)
			}
			cfg.RegistrationNs = append(cfg.RegistrationNs, n)
		}
	}
	if o.kinds != "" {
		for _, f := range strings.Split(o.kinds, ",") {
			k, ok := bench.Kinds[f]
			if !ok {
				return cfg, fmt.Errorf("-kinds: %q is not a plugin kind (device-plugin, dra)", f)
			}
			cfg.FloorKinds = append(cfg.FloorKinds, k)
		}
	}
	if o.writeBaseline != "" && len(cfg.Phases) > 0 && !slices.Contains(cfg.Phases, "floor") && !slices.Contains(cfg.Phases, "footprint") {
		return cfg, errors.New("-write-baseline: the ratios come from the floor and footprint phases, and -phases has neither")
	}
	if o.journalLoop < 0 || o.harnessGC < 0 || o.floorRounds < 0 {
		return cfg, errors.New("-journal-loop, -harness-gc-percent and -floor-rounds cannot be negative")
	}
	if o.floorRounds > 0 {
		cfg.FloorRounds = o.floorRounds
	}
	if o.journalLoop > 0 {
		cfg.JournalLoop = o.journalLoop
	}
	cfg.HarnessGCPercent = o.harnessGC
	tcp := &o.tcp
	tcp.Client = *o.clientTLS
	if o.apiTCP {
		if err := tcp.Check(); err != nil {
			return cfg, fmt.Errorf("-api-tcp: %w", err)
		}
		cfg.APITCP = tcp
	} else if tcp.Client != (app.TLS{}) || tcp.ServerCertFile != "" || tcp.ServerKeyFile != "" || tcp.ClientCAFile != "" {
		return cfg, errors.New("the TLS flags are for -api-tcp: without it the bench uses the Unix API sockets")
	}
	cfg.PprofDir, cfg.PprofSeconds = o.pprofDir, o.pprofSecs
	cfg.Root = o.root
	cfg.Bin = o.bin
	cfg.KubeletHarness = o.kubeletHarnessPath()
	return cfg, nil
}

// kubeletHarnessPath is -kubelet-harness: the path given; when none was,
// kubeletreg in the -bin directory if it is there and the bench runs as
// root (kubeletreg needs root); empty for "off" and otherwise.
func (o *options) kubeletHarnessPath() string {
	switch o.kubeletHarness {
	case "off":
		return ""
	case "":
		dir, err := stack.BinDir(o.bin)
		if err != nil || os.Geteuid() != 0 {
			return ""
		}
		path := filepath.Join(dir, "kubeletreg")
		if st, err := os.Stat(path); err != nil || st.IsDir() {
			return ""
		}
		return path
	}
	return o.kubeletHarness
}

// runBench runs the bench's phases with cfg, prints their table, compares
// their ratios with base (when not nil), writes their figures as JSON to
// o.out and their ratios as a baseline to o.writeBaseline (each when not
// empty).
func runBench(cfg bench.Config, o *options, base *bench.Baseline) int {
	cfg.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
		return 1
	}
	res.Command = "nodeplug-bench " + strings.Join(os.Args[1:], " ")
	fmt.Println()
	bench.Print(os.Stdout, res)
	regressed := false
	if base != nil {
		c := bench.Compare(base, res.Ratios)
		bench.PrintComparison(os.Stdout, os.Stderr, o.baseline, base, res.Machine, c)
		regressed = c.HasRegression()
	}
	if o.out != "" {
		if err := stack.WriteJSON(o.out, res); err != nil {
			fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
			return 1
		}
		fmt.Printf("\nfigures written to %s\n", o.out)
	}
	if o.markdown != "" {
		page := bench.MarkdownPage{Commit: sourceCommit()}
		if err := bench.WriteMarkdownFile(o.markdown, res, page); err != nil {
			fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
			return 1
		}
		fmt.Printf("figures written to %s\n", o.markdown)
	}
	if o.writeBaseline != "" {
		note := "ratios (lower is better) of `nodeplug-bench " + strings.Join(os.Args[1:], " ") + "`; a run reports each more than 25% above its value here. " +
			"Write it again with -write-baseline on a quiet machine when the figures move for good."
		b := bench.NewBaseline(res, note)
		if err := bench.WriteBaseline(o.writeBaseline, b); err != nil {
			fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
			return 1
		}
		fmt.Printf("baseline written to %s (%d ratios)\n", o.writeBaseline, len(b.Ratios))
	}
	if regressed && o.failOnRegression {
		return 3
	}
	return 0
}

// mergeBaseline writes o.writeBaseline from the figures files of earlier
// runs named by o.baselineFrom (-baseline-from), without running anything.
func mergeBaseline(o *options) int {
	if o.writeBaseline == "" {
		fmt.Fprintln(os.Stderr, "nodeplug-bench: -baseline-from needs -write-baseline, the file to write")
		return 2
	}
	files := strings.Split(o.baselineFrom, ",")
	runs := make([]*bench.Results, 0, len(files))
	for _, f := range files {
		r, err := bench.ReadResults(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
			return 1
		}
		runs = append(runs, r)
	}
	b, err := bench.MergeBaseline(runs)
	if err == nil {
		err = bench.WriteBaseline(o.writeBaseline, b)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-bench: -baseline-from:", err)
		return 1
	}
	fmt.Printf("baseline written to %s (%d ratios, the median of %d runs)\n", o.writeBaseline, len(b.Ratios), len(runs))
	return 0
}

// sourceCommit describes the checkout the bench runs in (git describe
// --always --dirty), or its version when there is no checkout.
func sourceCommit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return version.Version
	}
	return strings.TrimSpace(string(out))
}

// runBareClient is the child process of the footprint phase's bare-client
// figure.
func runBareClient(list string) int {
	data, err := os.ReadFile(list)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := bench.BareClient(ctx, strings.Split(strings.TrimSpace(string(data)), "\n"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// runContractFloor is one process of the floor phase's contract floor.
func runContractFloor(role string, args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := bench.ContractFloor(ctx, role, args, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
