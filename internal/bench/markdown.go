package bench

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
)

// MarkdownPage is what WriteMarkdown records beside the figures that the
// figures do not hold themselves (their date, machine and command are in
// Results): where they came from, so that a reader can tell their age and
// make them again.
type MarkdownPage struct {
	// Commit is the source they were measured on (git describe), if known.
	Commit string
}

// WriteMarkdown writes r as a Markdown page to w: a heading, the date, the
// machine and the command (r.Command), then the table Print writes,
// unchanged.
func WriteMarkdown(w io.Writer, r *Results, p MarkdownPage) error {
	var table bytes.Buffer
	Print(&table, r)
	var b strings.Builder
	b.WriteString("# Measured figures: nodeplug-bench\n\n")
	b.WriteString("Written by `make figures`; do not edit by hand — run it again to renew them.\n\n")
	fmt.Fprintf(&b, "- **Measured:** %s\n", r.Machine.Time)
	fmt.Fprintf(&b, "- **Machine:** %s\n", MachineDescription(r.Machine))
	if p.Commit != "" {
		fmt.Fprintf(&b, "- **Source:** %s\n", p.Commit)
	}
	fmt.Fprintf(&b, "- **Command:** `%s`\n\n", r.Command)
	b.WriteString("What each line measures, and the targets, are explained in [the performance guide](../performance.md).\n\n")
	b.WriteString("```text\n")
	b.WriteString(strings.TrimRight(table.String(), "\n"))
	b.WriteString("\n```\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteMarkdownFile renders the page, then writes it to path (as
// stack.WriteJSON writes the figures beside it).
func WriteMarkdownFile(path string, r *Results, p MarkdownPage) error {
	var buf bytes.Buffer
	if err := WriteMarkdown(&buf, r, p); err != nil {
		return err
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("figures: %w", err)
	}
	return nil
}

// ReadCPU reads the first processor's name ("AMD EPYC") and its identity
// (vendor, family, model and stepping: "AuthenticAMD family 25 model 17
// stepping 1") from /proc/cpuinfo; each is "" when it cannot be read.
func ReadCPU() (model, id string) {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "", ""
	}
	return parseCPUInfo(string(data))
}

// parseCPUInfo is ReadCPU on the text of /proc/cpuinfo, whose processors
// are blocks of lines with a blank line after each: it reads the first
// block. The identity needs all four fields.
func parseCPUInfo(text string) (model, id string) {
	fields := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if strings.TrimSpace(line) == "" && len(fields) > 0 {
			break // the end of the first processor
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	if v, f, m, st := fields["vendor_id"], fields["cpu family"], fields["model"], fields["stepping"]; v != "" && f != "" && m != "" && st != "" {
		id = fmt.Sprintf("%s family %s model %s stepping %s", v, f, m, st)
	}
	return fields["model name"], id
}
