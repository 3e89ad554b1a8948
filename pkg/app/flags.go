// Package app is the scaffolding every nodeplug service binary shares:
// flags with environment fallbacks, logging, tracing, the lock file, the gRPC
// and metrics listeners, and graceful shutdown.
package app

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/nodeplug/nodeplug/pkg/layout"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
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

// Common holds the flags that every nodeplug binary takes, services and
// tools alike.
type Common struct {
	RootDir     string // --root-dir (NODEPLUG_ROOT_DIR), default layout.DefaultRootDir
	LogLevel    string // --log-level: debug, info, warn or error
	LogFormat   string // --log-format: text or json
	ShowVersion bool   // --version: print the version and exit
}

// AddCommon defines --root-dir, --log-level, --log-format and --version on
// f, with the same defaults and meaning as the services' own, and returns
// where their values land once f is parsed.
func (f *Flags) AddCommon() *Common {
	c := &Common{}
	f.StringVar(&c.RootDir, "root-dir", layout.DefaultRootDir, "root directory: "+layout.PluginsRegistryDirName+"/ and "+layout.DevicePluginsDirName+"/ are beneath it")
	f.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	f.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	f.AddVersion(&c.ShowVersion)
	return c
}

// AddVersion defines --version alone, for a binary that neither logs nor
// works beneath the root dir (nodeplugctl).
func (f *Flags) AddVersion(p *bool) {
	f.BoolVar(p, "version", false, "print the version and exit")
}

// Logger returns the logger that --log-level and --log-format ask for,
// writing to w.
func (c *Common) Logger(w io.Writer) (*slog.Logger, error) {
	return telemetry.NewLogger(w, c.LogFormat, c.LogLevel)
}

// PrintDefaults prints every flag to f's output with its environment
// variable, its usage and its default. It is the usage message of Parse.
func (f *Flags) PrintDefaults() {
	out := f.Output()
	f.VisitAll(func(fl *flag.Flag) {
		fmt.Fprintf(out, "  --%s (env %s)\n    \t%s", fl.Name, f.EnvName(fl.Name), fl.Usage)
		if fl.DefValue != "" && fl.DefValue != "false" {
			fmt.Fprintf(out, " (default %q)", fl.DefValue)
		}
		fmt.Fprintln(out)
	})
}

// Parse parses args, then fills every flag not given on the command line
// from its environment variable. A variable that is set counts, even when
// empty.
func (f *Flags) Parse(args []string) error {
	f.Usage = func() {
		fmt.Fprintf(f.Output(), "Usage of %s:\n", f.Name())
		f.PrintDefaults()
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
