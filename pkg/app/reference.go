package app

import (
	"flag"
	"fmt"
	"os"
	"reflect"
	"strings"

	"github.com/nodeplug/nodeplug/pkg/refdoc"
)

// The configuration reference (docs/reference/) is rendered from the flag
// sets the binaries build: ServiceFlags is the one a service parses, and
// FlagRefs says what each of its flags is.

// FlagRef is one flag as a reference shows it.
type FlagRef struct {
	Name string
	// Type is what the value is: the placeholder its usage names in
	// backquotes, else "string", "int", "duration", "bool", "path" (made
	// absolute), "string, repeatable", or what the value's Type method
	// says.
	Type string
	// Default is the default as the flag package shows it (DefValue).
	Default string
	// DefaultNote, when set, is shown instead of Default: a default that
	// is not one value (each service's own, or one computed at run time
	// from the host or the user).
	DefaultNote string
	// Env is the flag's environment variable ("" for a plain flag set);
	// EnvList: it holds several values separated by ':'.
	Env     string
	EnvList bool
	Usage   string
	// Removed is what setting a removed flag (GoneFlag) answers; nil for a
	// flag in use.
	Removed error
}

// ServiceFlags returns the flag set svc's binary parses: the flags every
// service takes, then svc's own (svc.Flags). Nothing is run.
func ServiceFlags(svc Service) *Flags {
	fs, _, _ := serviceFlags(svc, &Config{Binary: svc.Binary})
	return fs
}

// FlagRefs returns the flags of fs in the order fs visits them (by name),
// without environment variables.
func FlagRefs(fs *flag.FlagSet) []FlagRef {
	var refs []FlagRef
	fs.VisitAll(func(fl *flag.Flag) {
		typ, usage := flagType(fl)
		r := FlagRef{Name: fl.Name, Type: typ, Default: fl.DefValue, Usage: usage}
		if g, ok := fl.Value.(goneFlag); ok {
			r.Removed = g.err
		}
		refs = append(refs, r)
	})
	return refs
}

// Refs returns the flags of f as FlagRefs does, each with its environment
// variable.
func (f *Flags) Refs() []FlagRef {
	refs := FlagRefs(f.FlagSet)
	for i := range refs {
		refs[i].Env = f.EnvName(refs[i].Name)
		refs[i].EnvList = f.lists[refs[i].Name]
	}
	return refs
}

// flagType returns the type a reference shows for fl, and its usage with
// a backquoted placeholder unquoted.
func flagType(fl *flag.Flag) (typ, usage string) {
	name, usage := flag.UnquoteUsage(fl)
	if strings.Contains(fl.Usage, "`") {
		return name, usage
	}
	switch v := fl.Value.(type) {
	case goneFlag:
		return "removed", usage
	case absPath:
		return "path", usage
	case *listValue:
		return "string, repeatable", usage
	case interface{ Type() string }:
		return v.Type(), usage
	}
	switch name {
	case "":
		return "bool", usage
	case "value":
		t := reflect.TypeOf(fl.Value)
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t.Kind() == reflect.Slice {
			return "list", usage
		}
		return strings.ToLower(t.Name()), usage
	}
	return name, usage
}

// FlagName is how references write a flag: -x for a one-letter name,
// --name for the others (the flag package takes either).
func FlagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// FlagTable renders the flags of refs in use (the removed ones left out)
// as a Markdown table: flag, type, default, the environment variable when
// any flag has one, and usage. It is "" when no flag is in use.
func FlagTable(refs []FlagRef) string {
	withEnv := false
	for _, r := range refs {
		withEnv = withEnv || r.Env != ""
	}
	header := []string{"Flag", "Type", "Default"}
	if withEnv {
		header = append(header, "Environment variable")
	}
	header = append(header, "Usage")
	var rows [][]string
	for _, r := range refs {
		if r.Removed != nil {
			continue
		}
		def := refdoc.CodeCell(r.Default)
		switch {
		case r.DefaultNote != "":
			def = refdoc.Cell(r.DefaultNote)
		case r.Default == "":
			def = "*none*"
		}
		row := []string{refdoc.CodeCell(FlagName(r.Name)), refdoc.Cell(r.Type), def}
		if withEnv {
			row = append(row, envCell(r))
		}
		rows = append(rows, append(row, refdoc.Cell(r.Usage)))
	}
	if rows == nil {
		return ""
	}
	return refdoc.Table(header, rows)
}

// RemovedTable renders the removed flags of refs as a Markdown table:
// flag, environment variable and what setting either answers. It is ""
// when none is removed.
func RemovedTable(refs []FlagRef) string {
	var rows [][]string
	for _, r := range refs {
		if r.Removed != nil {
			rows = append(rows, []string{refdoc.CodeCell(FlagName(r.Name)), envCell(r), refdoc.Cell(r.Removed.Error())})
		}
	}
	if rows == nil {
		return ""
	}
	return refdoc.Table([]string{"Flag", "Environment variable", "Setting it fails with"}, rows)
}

func envCell(r FlagRef) string {
	cell := refdoc.CodeCell(r.Env)
	if r.EnvList {
		cell += " (values separated by `:`)"
	}
	return cell
}

// HostDefaults returns an error naming each flag of refs whose default
// depends on where the reference is rendered: the host name, or a path
// beneath the home or the working directory. A reference gives such a
// flag a DefaultNote that describes it instead.
func HostDefaults(refs []FlagRef) error {
	host, _ := os.Hostname()
	var dirs []string
	if home, err := os.UserHomeDir(); err == nil && home != "/" {
		dirs = append(dirs, home)
	}
	if wd, err := os.Getwd(); err == nil && wd != "/" {
		dirs = append(dirs, wd)
	}
	var bad []string
	for _, r := range refs {
		if r.DefaultNote != "" || r.Default == "" {
			continue
		}
		if why := hostSpecific(r.Default, host, dirs); why != "" {
			bad = append(bad, fmt.Sprintf("%s (default %q has %s)", FlagName(r.Name), r.Default, why))
		}
	}
	if bad != nil {
		return fmt.Errorf("defaults that depend on the host, the user or the directory: %s; give each a DefaultNote that describes it",
			strings.Join(bad, ", "))
	}
	return nil
}

// hostSpecific says what of the host def has: host as one of its words,
// or one of dirs (or a path beneath it); "" when nothing.
func hostSpecific(def, host string, dirs []string) string {
	for _, w := range strings.FieldsFunc(def, func(r rune) bool { return strings.ContainsRune("/:,;= ", r) }) {
		if host != "" && w == host {
			return fmt.Sprintf("the host name %q", host)
		}
	}
	for _, d := range dirs {
		if def == d || strings.Contains(def, d+"/") {
			return fmt.Sprintf("the directory %q", d)
		}
	}
	return ""
}
