package docs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The checks themselves, on made-up files: each finds what it is for, and
// nothing else.

func TestLinksFound(t *testing.T) {
	for _, tc := range []struct {
		name, md string
		want     []string
	}{
		{"inline and image", "see [a](a.md) and ![b](img/b.png)\n", []string{"a.md", "img/b.png"}},
		{"title and anchor", "[a](a.md#part \"A\") [b](#top)\n", []string{"a.md#part", "#top"}},
		{"text over two lines", "[one\ntwo](c.md)\n", []string{"c.md"}},
		{"angle brackets", "[a](<d e.md>)\n", []string{"d e.md"}},
		{"reference definition", "[x][id]\n\n[id]: ref.md\n", []string{"ref.md"}},
		{"html", "<img src=\"p.png\" alt=\"\">\n", []string{"p.png"}},
		{"code span", "`[no](no.md)` [yes](yes.md)\n", []string{"yes.md"}},
		{"double backticks", "``a ` [no](no.md)`` [yes](yes.md)\n", []string{"yes.md"}},
		{"fenced block", "```sh\n[no](no.md)\n```\n[yes](yes.md)\n~~~\n[no](no2.md)\n~~~\n", []string{"yes.md"}},
		{"unclosed backtick", "a ` b [yes](yes.md)\n", []string{"yes.md"}},
		{"url", "[u](https://example.com/x)\n", []string{"https://example.com/x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, l := range links(tc.md) {
				got = append(got, l.target)
			}
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("links(%q) = %q, want %q", tc.md, got, want)
			}
		})
	}
}

func TestLinkLine(t *testing.T) {
	ls := links("# T\n\n```\nx\n```\n\ntext `code`\n[a](a.md)\n")
	if len(ls) != 1 || ls[0].line != 8 {
		t.Errorf("links = %+v, want a.md on line 8", ls)
	}
}

func TestAnchors(t *testing.T) {
	md := "# Title\n\n## The checkpoint's files\n\n### Checking a plugin: `nodeplugctl conform`\n\n" +
		"## TCP, with mutual TLS\n\n```\n# not a heading\n```\n\n## Again\n\n## Again\n\n## [Linked](x.md) *text*\n"
	got := anchors(md)
	for _, want := range []string{"title", "the-checkpoints-files", "checking-a-plugin-nodeplugctl-conform",
		"tcp-with-mutual-tls", "again", "again-1", "linked-text"} {
		if !got[want] {
			t.Errorf("no anchor %q among %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a comment in a code block was taken for a heading")
	}
}

func TestCheckOpening(t *testing.T) {
	for _, tc := range []struct {
		name, readme string
		ok           bool
	}{
		{"as it should", "# x\n\n```sh\nmake run     # run\nmake test    # test\n```\n", true},
		{"swapped", "# x\n\n```sh\nmake test\nmake run\n```\n", false},
		{"prose first", "# x\n\nnodeplug is…\n\n```sh\nmake run\nmake test\n```\n", false},
		{"one command", "# x\n\n```sh\nmake run\n```\n", false},
		{"make runner", "# x\n\n```sh\nmake runner\nmake test\n```\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkOpening(tc.readme); (err == nil) != tc.ok {
				t.Errorf("checkOpening: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestCheckLinks(t *testing.T) {
	root, err := os.MkdirTemp("", "npdocs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(root) })
	for p, text := range map[string]string{
		"README.md":                "# R\n",
		"docs/guide.md":            "# Guide\n\n## Part one\n",
		"docs/shot.png":            "png",
		"docs/figures/bench.md":    "# Bench\n",
		"services/watcher/main.go": "package main\n",
	} {
		p = filepath.Join(root, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		target string
		ok     bool
	}{
		{"guide.md", true},
		{"guide.md#part-one", true},
		{"guide.md#part-two", false},
		{"missing.md", false},
		{"shot.png", true},
		{"img/missing.png", false},
		{"../README.md", true},
		{"../services/watcher/main.go", true},
		{"../services/", true},
		{"/README.md", true},
		{"../../outside.md", false},
		{"#a-heading", true},
		{"#no-such-heading", false},
		{"reference/configuration.md", true}, // not written yet: allowed
		{"reference/configuration.md#flags", true},
		{"figures/bench.md", true},
		{"figures/bench.md#any-anchor", true}, // written by another program: its headings are its own
		{"https://example.com/missing", true},
		{"", false},
	} {
		md := "# Here\n\n## A heading\n\n[x](" + tc.target + ")\n"
		errs := checkLinks(root, "docs/here.md", md)
		if (len(errs) == 0) != tc.ok {
			t.Errorf("link %q: %v, want ok=%v", tc.target, errs, tc.ok)
		}
		for _, err := range errs {
			if !strings.HasPrefix(err.Error(), "docs/here.md:5: ") {
				t.Errorf("error %q does not name the file and line", err)
			}
		}
	}
}
