package main

import (
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPagesFromTheReferences: make package's man pages say each service's
// and nodeplugctl's flags and variables, from the references make docs
// keeps current, under a title naming the page, its section and version.
func TestPagesFromTheReferences(t *testing.T) {
	out := t.TempDir()
	if err := write(filepath.Join("..", "..", "docs", "reference"), out, "1.2.3"); err != nil {
		t.Fatal(err)
	}
	read := func(path string) string {
		t.Helper()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		r, err := gzip.NewReader(f)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for _, s := range Services {
		page := read(filepath.Join(out, "man8", "nodeplug-"+s.Name+".8.gz"))
		up := strings.ToUpper(s.Name)
		for _, want := range []string{
			`.TH NODEPLUG-` + up + ` 8 "" "nodeplug 1.2.3" "nodeplug"`,
			".SH NAME", ".SH COMMON FLAGS", ".SH SEE ALSO",
			"NODEPLUG_" + up + "_METRICS_LISTEN", // its own default
			"NODEPLUG_<SERVICE>_LOG_LEVEL",       // a common flag
			s.What,
		} {
			if !strings.Contains(page, want) {
				t.Errorf("nodeplug-%s.8 lacks %q", s.Name, want)
			}
		}
		if strings.Contains(page, "](") {
			t.Errorf("nodeplug-%s.8 keeps a Markdown link", s.Name)
		}
	}
	ctl := read(filepath.Join(out, "man1", "nodeplugctl.1.gz"))
	for _, want := range []string{`.TH NODEPLUGCTL 1 "" "nodeplug 1.2.3" "nodeplug"`, ".SH COMMANDS", "NODEPLUG_CTL_", "allocate", "nodeplug-dramanager(8)"} {
		if !strings.Contains(ctl, want) {
			t.Errorf("nodeplugctl.1 lacks %q", want)
		}
	}
}
