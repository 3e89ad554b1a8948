package app

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nodeplug/nodeplug/pkg/refdoc"
)

// servicePlaceholder stands for a service's name in what every service
// shares: NODEPLUG_<SERVICE>_<FLAG>, <root-dir>/nodeplug/<service>.sock.
const servicePlaceholder = "<service>"

// perService is the default shown for a common flag whose default is each
// service's own.
const perService = "each service's own"

// commonFlagRefs returns the flags every service takes, as the
// configuration reference shows them: for a service named <service>, and
// with the defaults that differ between services marked as such.
func commonFlagRefs() []FlagRef {
	refs := ServiceFlags(Service{Binary: servicePlaceholder}).Refs()
	a := ServiceFlags(Service{Binary: "a", DefaultMetrics: "127.0.0.1:1"}).Refs()
	b := ServiceFlags(Service{Binary: "b", DefaultMetrics: "127.0.0.1:2"}).Refs()
	for i := range refs {
		if a[i].Default != b[i].Default {
			refs[i].DefaultNote = perService
		}
	}
	return refs
}

// ConfigurationReference renders docs/reference/configuration.md: the
// services (each a link to its page, config/<service>.md, which
// ServiceReference renders), how flags and environment variables combine,
// the flags every service takes, and those of healthcheck.
func ConfigurationReference(services []string) (string, error) {
	common := commonFlagRefs()
	if err := HostDefaults(common); err != nil {
		return "", err
	}
	var b strings.Builder
	b.WriteString(refdoc.Header)
	b.WriteString("# Configuration reference\n\n")
	b.WriteString("Each service binary takes the [common flags](#common-flags) and flags of its own, listed on its page. " +
		"Every flag can also be set by an [environment variable](#environment-variables). " +
		"`nodeplugctl`'s flags and commands are in [nodeplugctl.md](nodeplugctl.md).\n\n")
	var rows [][]string
	for _, s := range services {
		rows = append(rows, []string{"`nodeplug-" + s + "`", fmt.Sprintf("[config/%s.md](config/%s.md)", s, s)})
	}
	b.WriteString(refdoc.Table([]string{"Binary", "Its flags"}, rows))
	b.WriteString("\n## Environment variables\n\n")
	b.WriteString(envRules())
	b.WriteString("\n## Common flags\n\n")
	fmt.Fprintf(&b, "Every service takes these flags. Their variables are written here for a service named `%s`. "+
		"A default shown as *%s* is on each service's page, under \"Common flags with a value of its own\".\n\n",
		servicePlaceholder, perService)
	b.WriteString(FlagTable(common))
	b.WriteString("\n### Removed common flags\n\n")
	b.WriteString("A removed flag is refused, and so is its variable (even empty): the service exits with status 2 and says what replaced it. " +
		"Removed flags are listed here and on the services' pages, never left out.\n\n")
	b.WriteString(orNone(RemovedTable(common), "None."))
	b.WriteString("\n## healthcheck\n\n")
	fmt.Fprintf(&b, "`nodeplug-%s healthcheck [flags]` checks the gRPC health of a running instance on its API socket, "+
		"for container health checks (images have no shell): exit status 0 when it serves, 1 when not, 2 for a bad flag. "+
		"It takes these flags only, with variables as above.\n\n", servicePlaceholder)
	hc, _, _ := healthcheckFlags(Service{Binary: servicePlaceholder})
	b.WriteString(FlagTable(hc.Refs()))
	return b.String(), nil
}

// envRules says how Flags.Parse and Flags.EnvName combine flags and
// environment variables.
func envRules() string {
	ex := NewFlags("watcher")
	rules := []string{
		fmt.Sprintf("A flag's variable is `NODEPLUG_<SERVICE>_<FLAG>`: the binary's name without `nodeplug-`, then the flag's name, "+
			"in upper case with `-` as `_`. nodeplug-watcher's `--log-level` is `%s`.", ex.EnvName("log-level")),
		fmt.Sprintf("`--root-dir` is the exception: every binary, nodeplugctl too, reads it from the one `%s`.", ex.EnvName("root-dir")),
		"A flag given on the command line wins: its variable is not read. Otherwise a variable that is set gives the flag its value; " +
			"otherwise the flag keeps its default.",
		"A variable that is set counts even when empty: a string or path flag then takes the empty value " +
			fmt.Sprintf("(`%s=` turns `/metrics` off), and a number, duration or bool flag refuses it. ", ex.EnvName("metrics-listen")) +
			"Unset a variable to leave the default.",
		"The variable of a repeatable flag holds several values separated by `:`; empty ones are skipped.",
		"The variables are read once, at start, after the command line. A value the flag refuses stops the binary with exit status 2 " +
			"and `environment variable NAME=\"value\": why`.",
	}
	var b strings.Builder
	for _, r := range rules {
		b.WriteString("- " + r + "\n")
	}
	b.WriteString("\n`-h` prints every flag with its variable, its usage and its default; `--version` prints the version.\n")
	return b.String()
}

func orNone(table, none string) string {
	if table == "" {
		return none + "\n"
	}
	return table
}

// ServiceReference renders docs/reference/config/<binary>.md for svc: its
// own flags, the common flags whose default or usage is its own, its
// removed flags and its garbage collector's target. notes gives a flag
// (by name) a DefaultNote: a default that depends on the host must have
// one, or ServiceReference fails.
func ServiceReference(svc Service, notes map[string]string) (string, error) {
	refs := ServiceFlags(svc).Refs()
	for name, note := range notes {
		i := slices.IndexFunc(refs, func(r FlagRef) bool { return r.Name == name })
		if i < 0 {
			return "", fmt.Errorf("a default note for --%s, which nodeplug-%s does not have", name, svc.Binary)
		}
		refs[i].DefaultNote = note
	}
	if err := HostDefaults(refs); err != nil {
		return "", fmt.Errorf("nodeplug-%s: %w", svc.Binary, err)
	}
	common := map[string]FlagRef{}
	for _, r := range commonFlagRefs() {
		common[r.Name] = r
	}
	var own, differ []FlagRef
	for _, r := range refs {
		c, ok := common[r.Name]
		switch {
		case !ok:
			own = append(own, r)
		case c.DefaultNote != "" || c.Default != r.Default || c.Usage != r.Usage || c.Type != r.Type:
			differ = append(differ, r)
		}
	}
	name := "nodeplug-" + svc.Binary
	var b strings.Builder
	b.WriteString(refdoc.Header)
	fmt.Fprintf(&b, "# %s\n\n", name)
	fmt.Fprintf(&b, "`%s` takes the [common flags](../configuration.md#common-flags) and the flags below. "+
		"Its environment variables are `%s` (`--root-dir`: `%s`): see [how flags and variables combine](../configuration.md#environment-variables).\n",
		name, NewFlags(svc.Binary).EnvName("<flag>"), NewFlags(svc.Binary).EnvName("root-dir"))
	b.WriteString("\n## Its own flags\n\n")
	b.WriteString(orNone(FlagTable(own), "None: it takes the common flags only."))
	b.WriteString("\n## Common flags with a value of its own\n\n")
	b.WriteString(orNone(FlagTable(differ), "None."))
	b.WriteString("\n## Removed flags\n\n")
	if removed := RemovedTable(own); removed != "" {
		b.WriteString("Besides the [removed common flags](../configuration.md#removed-common-flags):\n\n" + removed)
	} else {
		b.WriteString("None besides the [removed common flags](../configuration.md#removed-common-flags).\n")
	}
	b.WriteString("\n## Garbage collector\n\n")
	if svc.GCPercent == 0 {
		fmt.Fprintf(&b, "`%s` runs with Go's default target, `GOGC=100`, unless the `GOGC` variable says otherwise.\n", name)
	} else {
		fmt.Fprintf(&b, "`%s` runs with `GOGC=%d` unless the `GOGC` variable is set (not empty): then `GOGC` wins.\n", name, svc.GCPercent)
	}
	return b.String(), nil
}
