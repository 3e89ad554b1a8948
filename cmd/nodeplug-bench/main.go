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
	"github.com/nodeplug/nodeplug/pkg/app"
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
	floorRounds := flag.Int("floor-rounds", 0, "rounds of nodeplug, the floor and the contract floor per kind and N in the floor phase, their median reported (default 3; -short: 1); at N ≤ 100 one run's ratio varies widely on 2 cores, and more rounds steady it")
	journalLoop := flag.Duration("journal-loop", 0, "how long the durability phase's Allocate/Release loop follows the journal's size (default: 1m; -short: 1s)")
	harnessGC := flag.Int("harness-gc-percent", bench.DefaultHarnessGCPercent, "the bench process's own GC percent during the allocation and durability phases, whose callers and in-process plugins it hosts (0: Go's default)")
	pprofDir := flag.String("pprof", "", "write a CPU profile of each service, taken over the measured phases' first -pprof-seconds, into this directory")
	pprofSecs := flag.Int("pprof-seconds", 20, "how long the -pprof profiles run")
	showVersion := flag.Bool("version", false, "print the version and exit")
	scenario := flag.String("scenario", "", "run this scenario instead of the phases: "+scenarios)
	apiTCP := flag.Bool("api-tcp", false, "serve each service's API on a free 127.0.0.1 TCP port too (--listen-tcp) and make the bench's own API calls there, "+
		"over mutual TLS; without certificate files the bench makes a throwaway CA, a server and a client certificate (role operator) under <root-dir>/bench-tls/")
	// The client flags of nodeplugctl and the reconciler, with the same
	// names and meaning, used with -api-tcp; with certificates of one's own
	// the services' side is needed too.
	clientTLS := app.AddClientTLSFlags(flag.CommandLine)
	for _, name := range []string{"tls-cert-file", "tls-key-file", "tls-ca-file"} {
		f := flag.Lookup(name)
		f.Usage = "with -api-tcp: " + f.Usage + " (give all six certificate flags, or none)"
	}
	flag.Lookup("insecure-tcp").Usage = "with -api-tcp: no TLS on either side (the services get --insecure-tcp; loopback only, every caller has every role)"
	tcp := &bench.APITCP{}
	flag.StringVar(&tcp.ServerCertFile, "tls-server-cert-file", "", "with -api-tcp and your own client certificate: the services' --tls-cert-file, a server certificate for 127.0.0.1 signed by the -tls-ca-file CA")
	flag.StringVar(&tcp.ServerKeyFile, "tls-server-key-file", "", "with -api-tcp: key of -tls-server-cert-file (the services' --tls-key-file)")
	flag.StringVar(&tcp.ClientCAFile, "tls-client-ca-file", "", "with -api-tcp: the services' --tls-client-ca-file, the CA that signs -tls-cert-file")
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
	if *journalLoop < 0 || *harnessGC < 0 || *floorRounds < 0 {
		fmt.Fprintln(os.Stderr, "nodeplug-bench: -journal-loop, -harness-gc-percent and -floor-rounds cannot be negative")
		return 2
	}
	if *floorRounds > 0 {
		cfg.FloorRounds = *floorRounds
	}
	if *journalLoop > 0 {
		cfg.JournalLoop = *journalLoop
	}
	cfg.HarnessGCPercent = *harnessGC
	tcp.Client = *clientTLS
	if *apiTCP {
		if err := tcp.Check(); err != nil {
			fmt.Fprintln(os.Stderr, "nodeplug-bench: -api-tcp:", err)
			return 2
		}
		cfg.APITCP = tcp
	} else if tcp.Client != (app.TLS{}) || tcp.ServerCertFile != "" || tcp.ServerKeyFile != "" || tcp.ClientCAFile != "" {
		fmt.Fprintln(os.Stderr, "nodeplug-bench: the TLS flags are for -api-tcp: without it the bench uses the Unix API sockets")
		return 2
	}
	cfg.PprofDir, cfg.PprofSeconds = *pprofDir, *pprofSecs
	cfg.Root = *root
	cfg.Bin = *bin
	var err error
	if cfg.Bin, err = stack.BinDir(cfg.Bin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *scenario != "" {
		return runScenario(*scenario, cfg.Bin, cfg.Root, *short)
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
