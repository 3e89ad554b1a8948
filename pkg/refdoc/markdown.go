package refdoc

import "strings"

// cellEscaper escapes what would otherwise be Markdown in a table cell: a
// '|' ends the cell, '<' may start HTML ("<root-dir>"), '*' and '`' start
// emphasis and code.
var cellEscaper = strings.NewReplacer(`\`, `\\`, "|", `\|`, "<", `\<`, "*", `\*`, "`", "\\`", "\n", " ")

// Cell returns s as the text of a Markdown table cell: shown as it is.
func Cell(s string) string { return cellEscaper.Replace(s) }

// CodeCell returns s as a code span in a Markdown table cell; "" for an
// empty s.
func CodeCell(s string) string {
	if s == "" {
		return ""
	}
	s = strings.ReplaceAll(strings.ReplaceAll(s, "\n", " "), "|", `\|`)
	fence := "`"
	for strings.Contains(s, fence) {
		fence += "`"
	}
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") || fence != "`" {
		return fence + " " + s + " " + fence
	}
	return fence + s + fence
}

// Table renders a Markdown table: a header row, its delimiter row, then
// rows, each cell given as Markdown (see Cell and CodeCell).
func Table(header []string, rows [][]string) string {
	var b strings.Builder
	row := func(cells []string) {
		b.WriteString("|")
		for _, c := range cells {
			b.WriteString(" " + c + " |")
		}
		b.WriteString("\n")
	}
	row(header)
	delim := make([]string, len(header))
	for i := range delim {
		delim[i] = "---"
	}
	row(delim)
	for _, r := range rows {
		row(r)
	}
	return b.String()
}
