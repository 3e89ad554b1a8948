package docs

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/refdoc"
)

// maxReadmeLines is the most lines README.md may have: it is a front page,
// and the guides are in docs/.
const maxReadmeLines = 300

// generatedDirs hold files other programs write (the flag and command
// references, the measured figures): a link into them is checked only when
// its file exists, and not for its heading.
var generatedDirs = []string{"docs/reference", "docs/figures"}

// repoRoot returns the module's root (refdoc.ModuleRoot: the first
// directory above the package's that holds go.mod).
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := refdoc.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// read returns the file at rel, a slash path below root.
func read(t *testing.T, root, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// markdownFiles returns README.md and every .md file below docs/, as slash
// paths below root.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestReadmeIsAFrontPage(t *testing.T) {
	readme := read(t, repoRoot(t), "README.md")
	if n := strings.Count(strings.TrimSuffix(readme, "\n"), "\n") + 1; n > maxReadmeLines {
		t.Errorf("README.md has %d lines, at most %d: it is the front page; move the rest into a guide under docs/", n, maxReadmeLines)
	}
}

func TestReadmeOpensWithMakeRunAndMakeTest(t *testing.T) {
	if err := checkOpening(read(t, repoRoot(t), "README.md")); err != nil {
		t.Error(err)
	}
}

// checkOpening returns an error unless the first lines of readme after its
// title are a code block whose first two commands are make run and make
// test, the two commands that work on a fresh machine.
func checkOpening(readme string) error {
	var lines []string
	for i, l := range strings.Split(readme, "\n") {
		if l = strings.TrimSpace(l); l == "" || (i == 0 && strings.HasPrefix(l, "# ")) {
			continue
		}
		lines = append(lines, l)
		if len(lines) == 3 {
			break
		}
	}
	want := []string{"make run", "make test"}
	if len(lines) < 3 || !strings.HasPrefix(lines[0], "```") {
		return errors.New("README.md must open, after its title, with a code block of make run and make test")
	}
	for i, w := range want {
		if f := strings.Fields(lines[i+1]); len(f) < 2 || f[0]+" "+f[1] != w {
			return fmt.Errorf("README.md's opening code block must give %s as its command %d, found %q", w, i+1, lines[i+1])
		}
	}
	return nil
}

// tourCommand is a command line that test/e2e's TestMakeRun runs from the
// README's "Looking inside" section.
var tourCommand = regexp.MustCompile(`^(bin/nodeplugctl|\$GRPCURL) `)

// TestReadmeHasTheTour: test/e2e's TestMakeRun runs the commands of the
// README's "Looking inside" section against make run, and needs the
// section (and at least 8 commands in it) to find them. It runs only in
// the long tests; this says so at once.
func TestReadmeHasTheTour(t *testing.T) {
	readme := read(t, repoRoot(t), "README.md")
	in, fenced, n := false, false, 0
	for _, l := range strings.Split(readme, "\n") {
		switch {
		case strings.HasPrefix(l, "## "):
			in = l == "## Looking inside"
		case strings.HasPrefix(l, "```"):
			fenced = !fenced
		case in && fenced && tourCommand.MatchString(strings.TrimSpace(l)):
			n++
		}
	}
	if n < 8 {
		t.Errorf(`README.md's "## Looking inside" section has %d commands (bin/nodeplugctl or $GRPCURL lines in code blocks); test/e2e's TestMakeRun runs them and needs at least 8`, n)
	}
}

func TestRelativeLinksResolve(t *testing.T) {
	root := repoRoot(t)
	for _, f := range markdownFiles(t, root) {
		for _, err := range checkLinks(root, f, read(t, root, f)) {
			t.Error(err)
		}
	}
}

// checkLinks returns an error for each relative link of md, the file at
// rel below root, whose file does not exist, or whose anchor names no
// heading of a Markdown file.
func checkLinks(root, rel, md string) []error {
	var errs []error
	for _, l := range links(md) {
		if err := checkLink(root, rel, md, l.target); err != nil {
			errs = append(errs, fmt.Errorf("%s:%d: link %s: %w", rel, l.line, l.target, err))
		}
	}
	return errs
}

// scheme matches a URL's scheme (https:, mailto:): such a link is not
// checked.
var scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// checkLink checks one link's target, written in rel (whose text is md).
func checkLink(root, rel, md, target string) error {
	if target == "" {
		return errors.New("no target")
	}
	if scheme.MatchString(target) {
		return nil
	}
	path, anchor, _ := strings.Cut(target, "#")
	if path == "" {
		if !anchors(md)[anchor] {
			return errors.New("no heading of this file has that anchor")
		}
		return nil
	}
	p, err := url.PathUnescape(path)
	if err != nil {
		return err
	}
	dest := filepath.Join(filepath.Dir(filepath.FromSlash(rel)), filepath.FromSlash(p))
	if strings.HasPrefix(p, "/") { // from the repository's root, as GitHub reads it
		dest = filepath.Clean(filepath.FromSlash(p[1:]))
	}
	if dest == ".." || strings.HasPrefix(dest, ".."+string(filepath.Separator)) {
		return errors.New("it leads outside the repository")
	}
	slash := filepath.ToSlash(dest)
	generated := slices.ContainsFunc(generatedDirs, func(d string) bool {
		return strings.HasPrefix(slash+"/", d+"/")
	})
	fi, err := os.Stat(filepath.Join(root, dest))
	switch {
	case errors.Is(err, fs.ErrNotExist) && generated:
		return nil // written by another program; checked once it is there
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s does not exist", slash)
	case err != nil:
		return err
	case anchor == "" || generated || fi.IsDir() || !strings.HasSuffix(dest, ".md"):
		return nil
	}
	b, err := os.ReadFile(filepath.Join(root, dest))
	if err != nil {
		return err
	}
	if !anchors(string(b))[anchor] {
		return fmt.Errorf("no heading of %s has that anchor", slash)
	}
	return nil
}

func TestEveryGuideIsInTheIndex(t *testing.T) {
	root := repoRoot(t)
	index := read(t, root, "docs/README.md")
	linked := map[string]bool{}
	for _, l := range links(index) {
		path, _, _ := strings.Cut(l.target, "#")
		if !scheme.MatchString(path) && path != "" {
			linked[filepath.ToSlash(filepath.Clean(filepath.Join("docs", path)))] = true
		}
	}
	guides, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(guides) < 2 {
		t.Fatalf("found %d Markdown files in docs/: the guides are missing", len(guides))
	}
	for _, g := range guides {
		rel := "docs/" + filepath.Base(g)
		if rel != "docs/README.md" && !linked[rel] {
			t.Errorf("%s is not linked from docs/README.md, the guides' index: add a line for it", rel)
		}
	}
}
