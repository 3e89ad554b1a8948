// Command ctrprobe is the program of the container image the container-start
// test builds: run in a container, it prints as JSON what the container
// sees of the environment variables and paths it is asked about: each
// variable's value (absent: null), and for each path whether it exists,
// its kind (dir, file, char, block, other), whether it is a mount point and
// mounted read-only, a device node's major:minor, a file's content (at most
// 4 KiB) and a directory's entries.
//
//	ctrprobe [-env NAME]... [-wait] [PATH]...
//
// With -wait it then waits for SIGTERM and exits 0 (a long-running
// container).
//
// It is built static (CGO_ENABLED=0): the image holds nothing else.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// Report is what ctrprobe prints.
type Report struct {
	Env   map[string]*string `json:"env"`
	Paths map[string]Path    `json:"paths"`
}

// Path is what the container sees at one path.
type Path struct {
	Exists     bool     `json:"exists"`
	Kind       string   `json:"kind,omitempty"`
	MountPoint bool     `json:"mountPoint"`
	ReadOnly   bool     `json:"readOnly"`
	Device     string   `json:"device,omitempty"`
	Content    string   `json:"content,omitempty"`
	Entries    []string `json:"entries,omitempty"`
	Err        string   `json:"error,omitempty"`
}

type names []string

func (n *names) String() string     { return strings.Join(*n, ",") }
func (n *names) Set(v string) error { *n = append(*n, v); return nil }

func main() {
	var envs names
	fs := flag.NewFlagSet("ctrprobe", flag.ExitOnError)
	fs.Var(&envs, "env", "an environment variable to report (repeatable)")
	wait := fs.Bool("wait", false, "after the report, wait for SIGTERM")
	_ = fs.Parse(os.Args[1:])
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	mounts, err := mountPoints()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ctrprobe:", err)
		os.Exit(1)
	}
	r := Report{Env: map[string]*string{}, Paths: map[string]Path{}}
	for _, e := range envs {
		if v, ok := os.LookupEnv(e); ok {
			r.Env[e] = &v
		} else {
			r.Env[e] = nil
		}
	}
	for _, p := range fs.Args() {
		r.Paths[p] = probe(p, mounts)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		fmt.Fprintln(os.Stderr, "ctrprobe:", err)
		os.Exit(1)
	}
	if *wait {
		<-term
	}
}

func probe(path string, mounts map[string][]string) Path {
	var p Path
	fi, err := os.Lstat(path)
	if err != nil {
		p.Err = err.Error()
		return p
	}
	p.Exists = true
	if opts, ok := mounts[path]; ok {
		p.MountPoint = true
		p.ReadOnly = slices.Contains(opts, "ro")
	}
	switch m := fi.Mode(); {
	case m.IsDir():
		p.Kind = "dir"
		ents, err := os.ReadDir(path)
		if err != nil {
			p.Err = err.Error()
		}
		for _, e := range ents {
			p.Entries = append(p.Entries, e.Name())
		}
	case m.IsRegular():
		p.Kind = "file"
		f, err := os.Open(path)
		if err != nil {
			p.Err = err.Error()
			break
		}
		b, err := io.ReadAll(io.LimitReader(f, 4096))
		_ = f.Close()
		if err != nil {
			p.Err = err.Error()
		}
		p.Content = string(b)
	case m&os.ModeDevice != 0:
		p.Kind = "block"
		if m&os.ModeCharDevice != 0 {
			p.Kind = "char"
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			p.Device = fmt.Sprintf("%d:%d", major(st.Rdev), minor(st.Rdev))
		}
	default:
		p.Kind = "other"
	}
	return p
}

// major and minor decode a Linux dev_t.
func major(dev uint64) uint64 { return ((dev >> 8) & 0xfff) | ((dev >> 32) &^ 0xfff) }
func minor(dev uint64) uint64 { return (dev & 0xff) | ((dev >> 12) &^ 0xff) }

// mountPoints reads /proc/self/mountinfo: each mount point with its
// per-mount options (the last mount on a path wins, as it is the one seen).
func mountPoints() (map[string][]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 {
			continue
		}
		out[unescape(fields[4])] = strings.Split(fields[5], ",")
	}
	return out, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
