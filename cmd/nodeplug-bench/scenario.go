package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nodeplug/nodeplug/internal/bench"
)

// scenarios names what -scenario runs.
const scenarios = "apiflood (nodeplug-apiserver alone under a flood of watches that never read, slice churn and updates of a maximal slice, " +
	"while another client lists and watches; prints its peak and settled RSS and heap)"

// runScenario runs one scenario with the binaries in bin and prints its
// figures.
func runScenario(name, bin, root string, short bool) int {
	if name != "apiflood" {
		fmt.Fprintf(os.Stderr, "nodeplug-bench: unknown scenario %q (scenarios: %s)\n", name, scenarios)
		return 2
	}
	cfg := bench.DefaultAPIFlood()
	if short {
		cfg = bench.ShortAPIFlood()
	}
	cfg.Bin, cfg.Root, cfg.Progress = bin, root, os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := bench.APIFlood(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nodeplug-bench:", err)
		return 1
	}
	fmt.Println()
	bench.PrintAPIFlood(os.Stdout, res)
	return 0
}
