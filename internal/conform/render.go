package conform

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report as a table, one check a row, then what the
// kubelet does for every check that warned or failed, a summary line, and
// the tail of the plugin's output when a check failed.
func WriteTable(w io.Writer, r *Report) error {
	fmt.Fprintf(w, "target: %s\n", r.Target)
	if r.Path != "" {
		plugin := ""
		if r.Plugin != "" {
			plugin = fmt.Sprintf(" (%s)", r.Plugin)
		}
		fmt.Fprintf(w, "registers through: %s%s\n", r.Path, plugin)
	}
	if len(r.Resources) > 0 {
		fmt.Fprintf(w, "resources checked: %s\n", strings.Join(r.Resources, ", "))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tRESULT\tDETAIL")
	for _, res := range r.Results {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", res.Name, strings.ToUpper(string(res.Status)), oneLine(res.Detail))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	first := true
	for _, res := range r.Results {
		if res.Status != Fail && res.Status != Warn {
			continue
		}
		if first {
			fmt.Fprintln(w, "\nwhat the kubelet does:")
			first = false
		}
		fmt.Fprintf(w, "  %s: %s [%s]\n", res.Name, res.Kubelet, res.Ref)
	}
	fmt.Fprintf(w, "\n%d checks: %d pass, %d warn, %d fail, %d skip\n",
		len(r.Results), r.Count(Pass), r.Count(Warn), r.Count(Fail), r.Count(Skip))
	if r.PluginOutput != "" {
		fmt.Fprintf(w, "\nthe plugin's last output:\n%s", indent(r.PluginOutput, 40))
	}
	return nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// indent returns the last n lines of s, indented.
func indent(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}
