// Package app is the scaffolding every nodeplug service binary shares:
// flags with environment fallbacks, logging, tracing, the lock file, the gRPC
// and metrics listeners, and graceful shutdown.
package app

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Flags is a flag set whose flags fall back to environment variables. The
// variable of a flag is NODEPLUG_<BINARY>_<FLAG> (upper case, dashes as
// underscores), except --root-dir, which every binary reads from the shared
// NODEPLUG_ROOT_DIR. A flag given on the command line wins over its variable.
type Flags struct {
	*flag.FlagSet
	binary string
	lists  map[string]bool
}

// NewFlags returns an empty flag set for the binary named binary
// ("watcher", "reconciler", ...).
func NewFlags(binary string) *Flags {
	fs := flag.NewFlagSet("nodeplug-"+binary, flag.ContinueOnError)
	return &Flags{FlagSet: fs, binary: binary, lists: map[string]bool{}}
}

// EnvName returns the environment variable that backs flag name.
func (f *Flags) EnvName(name string) string {
	key := strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
	if name == "root-dir" {
		return "NODEPLUG_ROOT_DIR"
	}
	return "NODEPLUG_" + strings.ToUpper(strings.ReplaceAll(f.binary, "-", "_")) + "_" + key
}

// StringList defines a repeatable flag. Its environment variable holds
// several values separated by ':'.
func (f *Flags) StringList(name, usage string) *[]string {
	var v listValue
	f.Var(&v, name, usage)
	f.lists[name] = true
	return (*[]string)(&v)
}

type listValue []string

func (l *listValue) String() string     { return strings.Join(*l, ":") }
func (l *listValue) Set(s string) error { *l = append(*l, s); return nil }

// Parse parses args, then fills every flag not given on the command line
// from its environment variable.
func (f *Flags) Parse(args []string) error {
	f.Usage = func() {
		out := f.Output()
		fmt.Fprintf(out, "Usage of %s:\n", f.Name())
		f.VisitAll(func(fl *flag.Flag) {
			fmt.Fprintf(out, "  --%s (env %s)\n    \t%s", fl.Name, f.EnvName(fl.Name), fl.Usage)
			if fl.DefValue != "" && fl.DefValue != "false" {
				fmt.Fprintf(out, " (default %q)", fl.DefValue)
			}
			fmt.Fprintln(out)
		})
	}
	if err := f.FlagSet.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	f.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	var err error
	f.VisitAll(func(fl *flag.Flag) {
		if set[fl.Name] || err != nil {
			return
		}
		env, ok := os.LookupEnv(f.EnvName(fl.Name))
		if !ok {
			return
		}
		values := []string{env}
		if f.lists[fl.Name] {
			values = strings.Split(env, ":")
		}
		for _, v := range values {
			if v == "" && f.lists[fl.Name] {
				continue
			}
			if e := fl.Value.Set(v); e != nil {
				err = fmt.Errorf("environment variable %s=%q: %w", f.EnvName(fl.Name), env, e)
				return
			}
		}
	})
	return err
}
