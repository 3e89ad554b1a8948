// Command nodeplug-chaos runs nodeplug's services as real processes under
// load (device plugins on both registration paths, plugin churn, concurrent
// Allocate/Release clients), SIGKILLs them, kills the devicemanager in the
// middle of Allocate bursts and damages its checkpoint, and checks after
// every restart that nothing acknowledged was lost. It prints a table,
// writes the figures as JSON, and exits 1 on any violation.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodeplug/nodeplug/internal/chaos"
	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/pkg/version"
)

func main() {
	os.Exit(run())
}

func run() int {
	cfg := chaos.Default()
	short := flag.Bool("short", false, "a quick run: a few kills, each fault kind, 10 plugins")
	bin := flag.String("bin", "", "directory with nodeplug-watcher, -reconciler and -devicemanager (default: this binary's directory)")
	out := flag.String("json", "chaos-results.json", "write the figures here as JSON (empty: don't)")
	kills := flag.Int("kills", -1, "SIGKILLs of a random service (default 66; 6 with -short)")
	bursts := flag.Int("bursts", -1, "devicemanager kills mid-burst (default 30; 3 with -short)")
	compactionKills := flag.Int("compaction-kills", -1, "devicemanager kills during a checkpoint compaction (default 10; 3 with -short)")
	interval := flag.Duration("interval", 0, "time between kills (default 2s; 300ms with -short)")
	plugins := flag.Int("plugins", 0, "device plugins (default 50; 10 with -short)")
	seed := flag.Uint64("seed", 0, "random seed (0: from the clock)")
	root := flag.String("root-dir", "", "root dir for the services (default: a temporary directory)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("nodeplug-chaos", version.Version)
		return 0
	}
	if *short {
		cfg = chaos.Short()
	}
	if *kills >= 0 {
		cfg.Kills = *kills
	}
	if *bursts >= 0 {
		cfg.Bursts = *bursts
	}
	if *compactionKills >= 0 {
		cfg.CompactionKills = *compactionKills
	}
	if *interval > 0 {
		cfg.Interval = *interval
	}
	if *plugins > 0 {
		cfg.Plugins = *plugins
	}
	cfg.Seed, cfg.Root, cfg.Bin = *seed, *root, *bin
	var err error
	if cfg.Bin, err = stack.BinDir(cfg.Bin); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := chaos.Run(ctx, cfg)
	if res != nil {
		fmt.Println()
		chaos.Print(os.Stdout, res)
		if *out != "" {
			if werr := stack.WriteJSON(*out, res); werr != nil {
				fmt.Fprintln(os.Stderr, "nodeplug-chaos:", werr)
				return 1
			}
			fmt.Printf("\nfigures written to %s\n", *out)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-chaos:", err)
		return 1
	}
	if !res.OK() {
		fmt.Fprintln(os.Stderr, "nodeplug-chaos: invariants violated or a fault mishandled")
		return 1
	}
	return 0
}
