// Command manpages writes the man pages of the services (section 8) and of
// nodeplugctl (section 1), gzipped, from the references make docs
// generates out of the flag and command tables (docs/reference/): a
// service's page is its own reference and the common flags every service
// takes. make package puts them in the package.
//
// Usage: go run ./internal/manpages -version VERSION -out DIR
package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/cpuguy83/go-md2man/v2/md2man"
)

// Services are the service binaries and what each does, for NAME.
var Services = []struct{ Name, What string }{
	{"watcher", "stream the plugin registration directory's socket events"},
	{"reconciler", "register and unregister plugins with their handlers"},
	{"devicemanager", "device plugins, their allocation, the pod resources API, container start through CDI"},
	{"dramanager", "DRA drivers, this node's ResourceSlices, claims allocated, prepared and unprepared"},
	{"apiserver", "the node-local resource.k8s.io API that DRA drivers publish to"},
}

func main() {
	version := flag.String("version", "", "the version the pages name")
	out := flag.String("out", "", "directory to write man1/ and man8/ into")
	docs := flag.String("docs", "docs/reference", "the generated references")
	flag.Parse()
	if *out == "" || *version == "" {
		fmt.Fprintln(os.Stderr, "usage: manpages -version VERSION -out DIR [-docs DIR]")
		os.Exit(2)
	}
	if err := write(*docs, *out, *version); err != nil {
		fmt.Fprintln(os.Stderr, "manpages:", err)
		os.Exit(1)
	}
}

// write renders every page into out/man8 and out/man1.
func write(docs, out, version string) error {
	common, err := section(filepath.Join(docs, "configuration.md"), "Common flags")
	if err != nil {
		return err
	}
	for _, s := range Services {
		ref, err := os.ReadFile(filepath.Join(docs, "config", s.Name+".md"))
		if err != nil {
			return err
		}
		name := "nodeplug-" + s.Name
		page := Page(name, 8, version, s.What, "**"+name+"** [*flags*]\n\n**"+name+"** **healthcheck** [*flags*]",
			body(ref)+"\n# COMMON FLAGS\n\n"+common,
			"nodeplugctl(1), systemd unit "+name+".service, /etc/nodeplug/"+s.Name+".env")
		if err := gz(filepath.Join(out, "man8", name+".8.gz"), page); err != nil {
			return err
		}
	}
	ref, err := os.ReadFile(filepath.Join(docs, "nodeplugctl.md"))
	if err != nil {
		return err
	}
	var also []string
	for _, s := range Services {
		also = append(also, "nodeplug-"+s.Name+"(8)")
	}
	page := Page("nodeplugctl", 1, version, "inspect and drive nodeplug's services",
		"**nodeplugctl** [*global flags*] *COMMAND* [*flags*] [*args*]", body(ref), strings.Join(also, ", "))
	return gz(filepath.Join(out, "man1", "nodeplugctl.1.gz"), page)
}

var (
	comment = regexp.MustCompile(`(?m)^<!--.*-->\n`)
	// link is a Markdown link: a man page keeps its text.
	link = regexp.MustCompile(`\[([^\]]+)\]\([^)]+\)`)
)

// body is a reference page without its comment and title, its headings
// one level up (a page's sections are a man page's), its links as text.
func body(ref []byte) string {
	s := comment.ReplaceAllString(string(ref), "")
	s = link.ReplaceAllString(s, "$1")
	var b strings.Builder
	for l := range strings.Lines(s) {
		switch {
		case strings.HasPrefix(l, "# "):
			continue
		case strings.HasPrefix(l, "##"):
			l = strings.ToUpper(l[1:])
		}
		b.WriteString(l)
	}
	return b.String()
}

// section is the body of the level-2 section titled title in the page at
// path, up to the next level-2 heading, its links as text.
func section(path, title string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.Index(s, "\n## "+title+"\n")
	if i < 0 {
		return "", fmt.Errorf("%s has no section %q", path, title)
	}
	s = s[i+len("\n## "+title+"\n"):]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j+1]
	}
	return link.ReplaceAllString(s, "$1"), nil
}

// Page is a man page in roff: NAME, SYNOPSIS, the body's sections, SEE
// ALSO.
func Page(name string, sect int, version, what, synopsis, body, also string) []byte {
	// The title block is .TH's arguments: title, section, date (none: the
	// version says it), source, manual.
	md := fmt.Sprintf("%% %s %d \"\" \"nodeplug %s\" \"nodeplug\"\n\n# NAME\n\n%s - %s\n\n# SYNOPSIS\n\n%s\n\n# DESCRIPTION\n\n%s\n# SEE ALSO\n\n%s\n",
		strings.ToUpper(name), sect, version, name, what, synopsis, strings.TrimLeft(body, "\n"), also)
	return md2man.Render([]byte(md))
}

func gz(path string, page []byte) error {
	if len(page) == 0 {
		return errors.New(path + ": empty page")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := w.Write(page); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}
