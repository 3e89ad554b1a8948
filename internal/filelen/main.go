// Command filelen fails when a Go source file is longer than a limit: the
// length rule of make lint (no file over 600 lines in services/ and pkg/,
// tests and generated code aside). golangci-lint's funlen checks the
// functions; nothing in golangci-lint checks a file's length.
//
//	go run ./internal/filelen [-max 600] dir...
//
// It walks each dir, skips _test.go files and generated files (the
// "// Code generated ... DO NOT EDIT." line Go tools write), and prints
// every file over the limit with its length. It exits 1 when there is one,
// 2 when a dir cannot be read.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// known are the files over the limit that are being split, with why: each
// is a debt, not a licence. Remove a line once its file is short; a file
// listed here that is short again is reported, so the list stays true.
var known = map[string]string{}

// generated is the line that marks a generated file
// (https://go.dev/s/generatedcode).
var generated = regexp.MustCompile(`^// Code generated .* DO NOT EDIT\.$`)

func main() {
	max := flag.Int("max", 600, "most lines a file may have")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: filelen [-max n] dir...")
		os.Exit(2)
	}
	long, stale, err := check(flag.Args(), *max, known)
	if err != nil {
		fmt.Fprintln(os.Stderr, "filelen:", err)
		os.Exit(2)
	}
	for _, l := range long {
		fmt.Printf("%s: %d lines, more than %d: split it\n", l.path, l.lines, *max)
	}
	for _, p := range stale {
		fmt.Printf("%s: listed as a known long file in internal/filelen but no longer over %d lines: remove it from the list\n", p, *max)
	}
	if len(long) > 0 || len(stale) > 0 {
		os.Exit(1)
	}
}

type long struct {
	path  string
	lines int
}

// check returns the files under dirs over max lines that known does not
// list, and the files known lists that are under dirs and not over max.
func check(dirs []string, max int, known map[string]string) ([]long, []string, error) {
	var over []long
	seen := map[string]bool{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			n, gen, err := count(path)
			if err != nil || gen {
				return err
			}
			p := filepath.ToSlash(path)
			if _, ok := known[p]; ok {
				seen[p] = n > max
				if n > max {
					return nil
				}
			}
			if n > max {
				over = append(over, long{p, n})
			}
			return nil
		})
		if err != nil {
			return nil, nil, err
		}
	}
	var stale []string
	for p, stillLong := range seen {
		if !stillLong {
			stale = append(stale, p)
		}
	}
	sort.Strings(stale)
	return over, stale, nil
}

// count returns the number of lines in the file at path and whether it is
// generated.
func count(path string) (lines int, gen bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	for {
		line, err := r.ReadBytes('\n')
		if len(line) > 0 {
			lines++
			if generated.Match(bytes.TrimRight(line, "\r\n")) {
				gen = true
			}
		}
		if err == io.EOF {
			return lines, gen, nil
		}
		if err != nil {
			return 0, false, fmt.Errorf("read %s: %w", path, err)
		}
	}
}
