package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"

	"google.golang.org/grpc"
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

// usageFlag is a flag completion offers: its name, and whether a value
// follows it.
type usageFlag struct {
	name  string
	value bool
}

// flagsOf lists the flags of fs.
func flagsOf(fs interface{ VisitAll(func(*flag.Flag)) }) []usageFlag {
	var out []usageFlag
	fs.VisitAll(func(fl *flag.Flag) {
		b, ok := fl.Value.(interface{ IsBoolFlag() bool })
		out = append(out, usageFlag{name: fl.Name, value: !ok || !b.IsBoolFlag()})
	})
	return out
}

// commandFlagSet returns the flag set the command name parses (the global
// flags it takes after its name among them), as its -h sees it, or nil for
// no such command.
func commandFlagSet(ctx context.Context, name string) *flag.FlagSet {
	var got *flag.FlagSet
	c := &cli{stdout: io.Discard, stderr: io.Discard, http: &http.Client{}, conns: map[string]*grpc.ClientConn{},
		help: func(fs *flag.FlagSet) { got = fs }}
	defer c.close()
	for _, cmd := range commands {
		if cmd.name == name {
			_ = cmd.run(ctx, c, []string{"-h"})
		}
	}
	return got
}

// complete prints what may follow words: the global flags and the
// commands before a command, the command's flags after one. Nothing after
// a flag that takes a value, or when words do not parse.
func complete(ctx context.Context, words []string, stdout io.Writer) int {
	c := &cli{stdout: io.Discard, stderr: io.Discard}
	var showVersion bool
	fs := c.globalFlags(&showVersion)
	flags := flagsOf(fs)
	if fs.Parse(words) != nil {
		return exitOK
	}
	rest := fs.Args()
	var out []string
	if len(rest) > 0 { // a command: its own flag set's flags
		flags, words = nil, rest[1:]
		if cfs := commandFlagSet(ctx, rest[0]); cfs != nil {
			flags = flagsOf(cfs)
		}
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
	if len(rest) > 0 && rest[0] == "delete" && !hasArgs(flags, words) {
		for _, k := range objectKinds {
			out = append(out, k.singular)
		}
	}
	if len(rest) > 0 && rest[0] == "describe" && !hasArgs(flags, words) {
		out = append(out, "pod")
	}
	fmt.Fprintln(stdout, strings.Join(out, "\n"))
	return exitOK
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

// hasArgs reports whether words (a command's, flags among them) have an
// argument, or -f (delete's file, which names the objects).
func hasArgs(flags []usageFlag, words []string) bool {
	for i := 0; i < len(words); i++ {
		w := words[i]
		if w == "--" {
			return i+1 < len(words)
		}
		name := strings.TrimLeft(w, "-")
		if name == w {
			return true
		}
		name, _, hasValue := strings.Cut(name, "=")
		if name == "f" || name == "filename" {
			return true
		}
		for _, f := range flags {
			if f.name == name && f.value && !hasValue {
				i++ // its value
			}
		}
	}
	return false
}
