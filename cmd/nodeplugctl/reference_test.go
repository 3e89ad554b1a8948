package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/app"
	"github.com/nodeplug/nodeplug/pkg/refdoc"
)

// TestReference: docs/reference/nodeplugctl.md is what the global flag
// set and the command table render (make docs writes it).
func TestReference(t *testing.T) {
	err := refdoc.CheckStable("docs/reference/nodeplugctl.md", t, func() (string, error) { return renderReference() })
	if err != nil {
		t.Fatal(err)
	}
}

// TestReferenceCommandFlags: a command's flags in the reference are those
// of the flag set it parses, the global ones left out.
func TestReferenceCommandFlags(t *testing.T) {
	var allocate command
	for _, cmd := range commands {
		if cmd.name == "allocate" {
			allocate = cmd
		}
	}
	refs, err := commandFlags(allocate)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range refs {
		names = append(names, r.Name)
	}
	if got, want := strings.Join(names, " "), "container must-include name namespace o output pod"; got != want {
		t.Errorf("allocate's flags: %s, want %s", got, want)
	}
	if _, err := commandFlags(command{name: "broken", run: func(context.Context, *cli, []string) error { return nil }}); err == nil {
		t.Error("a command that never parses -h passes")
	}
}

// renderReference renders the nodeplugctl reference: its usage line, the
// global flags with their variables, then each command of the table, in
// its order, with its synopsis, summary and flags.
func renderReference() (string, error) {
	var b strings.Builder
	b.WriteString(refdoc.Header)
	b.WriteString("# nodeplugctl\n\n")
	var usage bytes.Buffer
	if code := run(context.Background(), []string{"help"}, &usage, io.Discard); code != exitOK {
		return "", fmt.Errorf("nodeplugctl help: exit status %d", code)
	}
	line, _, _ := strings.Cut(usage.String(), "\n")
	fmt.Fprintf(&b, "```\n%s\n```\n\n", strings.TrimPrefix(line, "usage: "))
	b.WriteString("`nodeplugctl help` (or `-h`) prints the commands and the global flags; `nodeplugctl COMMAND -h` a command's usage and flags.\n")
	b.WriteString(globalSection())
	b.WriteString("\n## Commands\n\n")
	b.WriteString("A command's flags may come before, between or after its arguments; `--` ends them. " +
		"A command's `-o` defaults to the global `-o` when one is given before the command. " +
		"Command flags have no environment variables.\n\n")
	var rows [][]string
	for _, cmd := range commands {
		rows = append(rows, []string{fmt.Sprintf("[`%s`](#%s)", cmd.name, cmd.name), refdoc.Cell(cmd.summary)})
	}
	b.WriteString(refdoc.Table([]string{"Command", "What it does"}, rows))
	for _, cmd := range commands {
		refs, err := commandFlags(cmd)
		if err != nil {
			return "", err
		}
		if err := app.HostDefaults(refs); err != nil {
			return "", fmt.Errorf("nodeplugctl %s: %w", cmd.name, err)
		}
		fmt.Fprintf(&b, "\n### %s\n\n", cmd.name)
		fmt.Fprintf(&b, "```\n%s\n```\n\n", strings.TrimSpace("nodeplugctl "+cmd.name+" "+cmd.args))
		b.WriteString(strings.ToUpper(cmd.summary[:1]) + cmd.summary[1:] + ".\n\n")
		if table := app.FlagTable(refs); table != "" {
			b.WriteString(table)
		} else {
			b.WriteString("No flags of its own.\n")
		}
	}
	b.WriteString("\n## Exit status\n\n")
	fmt.Fprintf(&b, "`%d`: done. `%d`: the command failed (the message says why). `%d`: a mistake on the command line (the usage follows).\n",
		exitOK, exitError, exitUsage)
	return b.String(), nil
}

// globalSection renders the global flags, as run parses them.
func globalSection() string {
	var b strings.Builder
	c := &cli{}
	var showVersion bool
	fs := c.globalFlags(&showVersion)
	refs := fs.Refs()
	after := globalFlagSet()
	var beforeOnly []string
	for _, r := range refs {
		if after.Lookup(r.Name) == nil {
			beforeOnly = append(beforeOnly, "`"+app.FlagName(r.Name)+"`")
		}
	}
	b.WriteString("\n## Global flags\n\n")
	fmt.Fprintf(&b, "These flags come before the command; all but %s may also follow it. "+
		"Each also reads its environment variable, `NODEPLUG_CTL_<FLAG>` (`--timeout`: `%s`), except `--root-dir`, which reads `%s` as the services do. "+
		"A flag on the command line wins over its variable; a variable that is set, even empty, over the default "+
		"([the services' rules](configuration.md#environment-variables)).\n\n",
		strings.Join(beforeOnly, ", "), fs.EnvName("timeout"), fs.EnvName("root-dir"))
	b.WriteString(app.FlagTable(refs))
	return b.String()
}

// commandFlags returns the flags of cmd's own flag set: the one it parses,
// taken on -h, without the global flags it also takes.
func commandFlags(cmd command) ([]app.FlagRef, error) {
	got := commandFlagSet(context.Background(), cmd.name)
	if got == nil {
		return nil, fmt.Errorf("nodeplugctl %s -h: its flag set was not seen", cmd.name)
	}
	global := globalFlagSet()
	var own []app.FlagRef
	for _, r := range app.FlagRefs(got) {
		if global.Lookup(r.Name) == nil {
			own = append(own, r)
		}
	}
	return own, nil
}

// globalFlagSet returns a flag set of the global flags every command takes
// after its name too (globals.define).
func globalFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("global", flag.ContinueOnError)
	var g globals
	g.define(fs, globalDefaults)
	return fs
}
