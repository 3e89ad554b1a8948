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

// usageFlag is a flag completion offers: its name, and whether a value
// follows it.
type usageFlag struct {
	name  string
	value bool
}

// complete prints what may follow words: the global flags and the
// commands before a command, the command's flags after one. Nothing after
// a flag that takes a value, or when words do not parse.
func complete(ctx context.Context, words []string, stdout io.Writer) int {
	c := &cli{stdout: io.Discard, stderr: io.Discard}
	var showVersion bool
	fs := c.globalFlags(&showVersion)
	var flags []usageFlag
	fs.VisitAll(func(fl *flag.Flag) {
		b, ok := fl.Value.(interface{ IsBoolFlag() bool })
		flags = append(flags, usageFlag{name: fl.Name, value: !ok || !b.IsBoolFlag()})
	})
	if fs.Parse(words) != nil {
		return exitOK
	}
	rest := fs.Args()
	var out []string
	if len(rest) > 0 { // a command: its flags, read from its usage
		var help bytes.Buffer
		run(ctx, []string{rest[0], "-h"}, &help, &help)
		flags, words = usageFlags(help.String()), rest[1:]
	}
	if valueNext(flags, words) {
		return exitOK
	}
	for _, f := range flags {
		out = append(out, "--"+f.name)
	}
	if len(rest) == 0 {
		for _, cmd := range commands {
			out = append(out, cmd.name)
		}
	}
	fmt.Fprintln(stdout, strings.Join(out, "\n"))
	return exitOK
}

// usageFlags lists the flags in a flag set's usage text.
func usageFlags(usage string) []usageFlag {
	var out []usageFlag
	for l := range strings.Lines(usage) {
		if m := flagLine.FindStringSubmatch(strings.TrimRight(l, "\n")); m != nil {
			out = append(out, usageFlag{name: m[1], value: m[2] != ""})
		}
	}
	return out
}

// valueNext reports whether the last of words is one of flags that takes
// a value (so the word being typed is that value).
func valueNext(flags []usageFlag, words []string) bool {
	if len(words) == 0 {
		return false
	}
	last := strings.TrimLeft(words[len(words)-1], "-")
	if last == words[len(words)-1] || strings.Contains(last, "=") {
		return false
	}
	for _, f := range flags {
		if f.name == last {
			return f.value
		}
	}
	return false
}
