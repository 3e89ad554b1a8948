// Command nodeplug-bench measures nodeplug with real processes and real
// plugins: registration and deregistration latency, churn, allocation
// throughput, device update propagation and footprint. It prints a table and
// writes the figures as JSON.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/nodeplug/nodeplug/internal/bench"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/pkg/version"
)

func main() {
	os.Exit(run())
}

func run() int {
	short := flag.Bool("short", false, "a quick run that still produces every figure")
	bin := flag.String("bin", "", "directory with nodeplug-watcher, -reconciler and -devicemanager (default: this binary's directory)")
	out := flag.String("json", "bench-results.json", "write the figures here as JSON (empty: don't)")
	root := flag.String("root-dir", "", "root dir for the services (default: a temporary directory)")
	phases := flag.String("phases", "", "comma-separated phases to run, of "+strings.Join(bench.Phases, ",")+" (default: all)")
	regN := flag.String("registration-n", "", "comma-separated plugin counts of the registration rounds (default: 1,10,100,1000; -short: 1,10)")
	pprofDir := flag.String("pprof", "", "write a CPU profile of each service, taken over the measured phases' first -pprof-seconds, into this directory")
	pprofSecs := flag.Int("pprof-seconds", 20, "how long the -pprof profiles run")
	showVersion := flag.Bool("version", false, "print the version and exit")
	bareClient := flag.String(bench.BareClientFlag, "", "(internal) measure a bare grpc-go client of the device plugin endpoints listed in this file, print JSON")
	contractFloor := flag.String(bench.ContractFloorFlag, "", "(internal) run this role of the contract floor, with the other arguments")
	flag.Parse()
	if *bareClient != "" {
		return runBareClient(*bareClient)
	}
	if *contractFloor != "" {
		return runContractFloor(*contractFloor, flag.Args())
	}
	if *showVersion {
		fmt.Println("nodeplug-bench", version.Version)
		return 0
	}
	cfg := bench.Default()
	if *short {
		cfg = bench.Short()
	}
	if *phases != "" {
		cfg.Phases = strings.Split(*phases, ",")
		if err := bench.CheckPhases(cfg.Phases); err != nil {
			fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
			return 2
		}
	}
	if *regN != "" {
		cfg.RegistrationNs = nil
		for _, f := range strings.Split(*regN, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "nodeplug-bench: -registration-n: %q is not a positive count\n", f)
				return 2
			}
			cfg.RegistrationNs = append(cfg.RegistrationNs, n)
		}
	}
	cfg.PprofDir, cfg.PprofSeconds = *pprofDir, *pprofSecs
	cfg.Root = *root
	cfg.Bin = *bin
	var err error
	if cfg.Bin, err = stack.BinDir(cfg.Bin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := bench.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
		return 1
	}
	fmt.Println()
	bench.Print(os.Stdout, res)
	if *out != "" {
		if err := stack.WriteJSON(*out, res); err != nil {
			fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
			return 1
		}
		fmt.Printf("\nfigures written to %s\n", *out)
	}
	return 0
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
