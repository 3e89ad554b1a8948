package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nodeplug/nodeplug/internal/conform"
)

const conformArgs = "(--socket PATH | -- CMD ARGS...) [--only CHECK,...] [--skip CHECK,...] [-o table|json]"

// listFlag is a repeatable flag whose values may also be comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// cmdConform checks a plugin against the kubelet's contract
// (internal/conform): it exits non-zero when a check fails.
func cmdConform(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("conform", conformArgs)
	out := c.outputFlag(fs, "table", "json")
	var cfg conform.Config
	var only, skip, allowed, env listFlag
	var showOutput bool
	fs.StringVar(&cfg.Socket, "socket", "", "the plugin's socket: a plugins_registry socket (any plugin type) or a device plugin socket")
	fs.Var(&only, "only", "run only these checks (comma-separated or repeated): "+strings.Join(conform.Names(), ", "))
	fs.Var(&skip, "skip", "skip these checks (comma-separated or repeated)")
	fs.Var(&allowed, "allowed-endpoint-dir", "where endpoints may be, as the services' flag (default: the root dir; with --socket the parent of its directory)")
	fs.Var(&env, "env", "KEY=VALUE added to the started plugin's environment (repeatable)")
	fs.DurationVar(&cfg.RegisterWait, "register-wait", conform.DefaultRegisterWait, "how long the started plugin has to register, and to register again after kubelet.sock is re-created")
	fs.IntVar(&cfg.Resources, "resources", 0, "with a command: how many resources the plugin serves, each registered on its own; conform waits (within --register-wait) for that many before checking the others (0: those registered while the first was checked)")
	fs.DurationVar(&cfg.Observe, "observe", conform.DefaultObserve, "how long to watch for what must not happen (health flaps, a new stream ending, a crash after socket removal)")
	fs.DurationVar(&cfg.RecreateWait, "recreate-wait", conform.DefaultRecreateWait, "how long socket-removal waits for the plugin to create its removed socket again")
	fs.StringVar(&cfg.Root, "plugin-root", "", "with a command: serve kubelet.sock and plugins_registry under this dir instead of a temporary one (for plugins that hard-code /var/lib/kubelet; refused when a kubelet answers there)")
	fs.BoolVar(&showOutput, "plugin-output", false, "copy the started plugin's output to stderr as it comes")
	flagArgs, command := args, []string(nil)
	if i := slices.Index(args, "--"); i >= 0 {
		flagArgs, command = args[:i], args[i+1:]
	}
	if err := noArgs(fs, flagArgs); err != nil {
		return err
	}
	if err := checkOutput(*out, "table", "json"); err != nil {
		return err
	}
	if (cfg.Socket == "") == (len(command) == 0) {
		return usagef("give either --socket PATH or -- CMD ARGS")
	}
	cfg.Command, cfg.Env, cfg.AllowedDirs = command, env, allowed
	cfg.Only, cfg.Skip = only, skip
	cfg.Timeout = c.g.timeout
	if err := cfg.Validate(); err != nil {
		return usagef("%v", err)
	}
	if showOutput {
		cfg.PluginOutput = c.stderr
	}
	rep, err := conform.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if *out == "json" {
		err = conform.WriteJSON(c.stdout, rep)
	} else {
		err = conform.WriteTable(c.stdout, rep)
	}
	if err != nil {
		return err
	}
	if n := rep.Count(conform.Fail); n > 0 {
		return fmt.Errorf("%d of %d checks failed", n, len(rep.Results))
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("interrupted")
	}
	return nil
}
