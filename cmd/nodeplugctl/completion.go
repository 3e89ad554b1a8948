package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// completeCommand is the hidden command the completion scripts call with
// the words typed so far (not the one being typed); it prints the words
// that may come next, one a line.
const completeCommand = "__complete"

const completionArgs = "bash|zsh"

// bashCompletion asks nodeplugctl itself what may come next, so that the
// commands and flags offered are always the installed binary's. With no
// word offered (a flag's value, a command's arguments) bash completes file
// names.
const bashCompletion = `# nodeplugctl completion for bash: source <(nodeplugctl completion bash),
# or install as /usr/share/bash-completion/completions/nodeplugctl.
_nodeplugctl() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  local IFS=$'\n'
  COMPREPLY=($(compgen -W "$("${COMP_WORDS[0]}" ` + completeCommand + ` "${COMP_WORDS[@]:1:COMP_CWORD-1}" 2>/dev/null)" -- "$cur"))
}
complete -o default -F _nodeplugctl nodeplugctl
`

const zshCompletion = `# nodeplugctl completion for zsh: source <(nodeplugctl completion zsh)
autoload -U +X bashcompinit && bashcompinit
` + bashCompletion

func cmdCompletion(_ context.Context, c *cli, args []string) error {
	fs := c.flags("completion", completionArgs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usagef("name one shell: bash or zsh")
	}
	switch fs.Arg(0) {
	case "bash":
		_, err := io.WriteString(c.stdout, bashCompletion)
		return err
	case "zsh":
		_, err := io.WriteString(c.stdout, zshCompletion)
		return err
	}
	return usagef("no completion for shell %q: bash or zsh", fs.Arg(0))
}

// flagLine is a flag in a flag set's usage: its name, and its value's
// type when it takes one.
var flagLine = regexp.MustCompile(`^  -(\S+)(?: (\S+))?$`)

// complete prints what may follow words: the global flags and the
// commands before a command, the command's flags after one. Nothing after
// a flag that takes a value, or when words do not parse.
func complete(ctx context.Context, words []string, stdout io.Writer) int {
	c := &cli{stdout: io.Discard, stderr: io.Discard}
	var showVersion bool
	fs := c.globalFlags(&showVersion)
	// The global flags in the usage form of a command's flags (which
	// app.Flags prints otherwise): "  -name" and its value's type, if any.
	var usage strings.Builder
	fs.VisitAll(func(fl *flag.Flag) {
		typ := " value"
		if b, ok := fl.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			typ = ""
		}
		fmt.Fprintf(&usage, "  -%s%s\n", fl.Name, typ)
	})
	if fs.Parse(words) != nil {
		return exitOK
	}
	var out []string
	rest := fs.Args()
	if len(rest) == 0 {
		if valueNext(usage.String(), words) {
			return exitOK
		}
		out = append(out, flagsOf(usage.String())...)
		for _, cmd := range commands {
			out = append(out, cmd.name)
		}
	} else {
		var help bytes.Buffer
		run(ctx, []string{rest[0], "-h"}, &help, &help)
		if valueNext(help.String(), rest[1:]) {
			return exitOK
		}
		out = flagsOf(help.String())
	}
	fmt.Fprintln(stdout, strings.Join(out, "\n"))
	return exitOK
}

// flagsOf lists the flags in a usage text, as --name.
func flagsOf(usage string) []string {
	var out []string
	for l := range strings.Lines(usage) {
		if m := flagLine.FindStringSubmatch(strings.TrimRight(l, "\n")); m != nil {
			out = append(out, "--"+m[1])
		}
	}
	return out
}

// valueNext reports whether the last of words is a flag of usage that
// takes a value (so the word being typed is that value).
func valueNext(usage string, words []string) bool {
	if len(words) == 0 {
		return false
	}
	last := strings.TrimLeft(words[len(words)-1], "-")
	if last == words[len(words)-1] || strings.Contains(last, "=") {
		return false
	}
	for l := range strings.Lines(usage) {
		if m := flagLine.FindStringSubmatch(strings.TrimRight(l, "\n")); m != nil && m[1] == last {
			return m[2] != ""
		}
	}
	return false
}
