package docs

import (
	"fmt"
	"regexp"
	"strings"
	"unicode"
)

// A link is a link's target as written in a Markdown file, and the line it
// starts on.
type link struct {
	target string
	line   int
}

var (
	// inlineLink matches [text](target) and ![alt](target), the text
	// possibly over several lines, the target possibly followed by a
	// title; group 1 is the target.
	inlineLink = regexp.MustCompile(`\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]*)(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)`)
	// refDefinition matches a reference definition, [id]: target.
	refDefinition = regexp.MustCompile(`(?m)^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	// htmlTarget matches the src or href of an HTML tag.
	htmlTarget = regexp.MustCompile(`<[a-zA-Z][^>]*\s(?:src|href)="([^"]*)"`)
	// headingLink matches a link in a heading; group 1 is its text.
	headingLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
	// atxHeading matches "# Title" to "###### Title".
	atxHeading = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$`)
)

// prose returns md with what is not prose blanked out, newlines kept so
// that offsets keep their line: fenced code blocks and inline code spans.
func prose(md string) string {
	return blankCodeSpans(blankFences(md))
}

// blankFences returns md with its fenced code blocks blanked, fences
// included.
func blankFences(md string) string {
	lines := strings.SplitAfter(md, "\n")
	fence := ""
	for i, l := range lines {
		trimmed := strings.TrimLeft(l, " ")
		switch {
		case fence != "":
			if strings.HasPrefix(trimmed, fence) && strings.Trim(strings.TrimSpace(trimmed), fence[:1]) == "" {
				fence = ""
			}
			lines[i] = blank(l)
		case strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~"):
			fence = trimmed[:3]
			lines[i] = blank(l)
		}
	}
	return strings.Join(lines, "")
}

// blankCodeSpans blanks every inline code span of s: a run of n backticks
// up to the next run of exactly n. A run with no closing run is literal.
func blankCodeSpans(s string) string {
	b := []byte(s)
	for i := 0; i < len(b); {
		if b[i] != '`' {
			i++
			continue
		}
		n := backticks(b, i)
		end := -1
		for j := i + n; j < len(b); {
			if b[j] != '`' {
				j++
				continue
			}
			m := backticks(b, j)
			if m == n {
				end = j + m
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		copy(b[i:end], blank(string(b[i:end])))
		i = end
	}
	return string(b)
}

// backticks returns the length of the run of backticks at b[i].
func backticks(b []byte, i int) int {
	n := 0
	for i+n < len(b) && b[i+n] == '`' {
		n++
	}
	return n
}

// blank returns s with every byte but newlines made a space: as long as s
// in bytes, so that offsets into it stay offsets into s.
func blank(s string) string {
	b := []byte(s)
	for i := range b {
		if b[i] != '\n' {
			b[i] = ' '
		}
	}
	return string(b)
}

// links returns the targets of md's inline links and images, reference
// definitions and HTML src and href attributes, outside code.
func links(md string) []link {
	text := prose(md)
	var out []link
	for _, re := range []*regexp.Regexp{inlineLink, refDefinition, htmlTarget} {
		for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
			target := strings.TrimSuffix(strings.TrimPrefix(text[m[2]:m[3]], "<"), ">")
			out = append(out, link{target: target, line: 1 + strings.Count(text[:m[0]], "\n")})
		}
	}
	return out
}

// anchors returns the anchors GitHub gives md's headings: the heading's
// text in lower case, spaces as dashes, every character but letters,
// digits, dashes and underscores left out; a repeated one gets -1, -2, ….
func anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range strings.Split(blankFences(md), "\n") {
		m := atxHeading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		a := slug(m[1])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// slug is a heading's anchor, as GitHub makes it.
func slug(heading string) string {
	// A link in a heading counts by its text.
	heading = headingLink.ReplaceAllString(heading, "$1")
	var sb strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			sb.WriteRune(r)
		case r == ' ':
			sb.WriteByte('-')
		}
	}
	return sb.String()
}
