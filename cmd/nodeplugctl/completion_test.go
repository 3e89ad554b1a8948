package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/internal/stack"
	"github.com/nodeplug/nodeplug/internal/testutil"
)

// completions runs the hidden completion command with the words typed
// before the one being typed.
func completions(t *testing.T, words ...string) []string {
	t.Helper()
	var out bytes.Buffer
	if code := run(context.Background(), append([]string{completeCommand}, words...), &out, &out); code != exitOK {
		t.Fatalf("%s %q: exit %d\n%s", completeCommand, words, code, out.String())
	}
	return strings.Fields(out.String())
}

// TestComplete: before a command, the global flags and every command;
// after one, its flags, the global ones among them; after a flag that
// takes a value, nothing (the shell completes a file name); after a bool
// flag, what came before it.
func TestComplete(t *testing.T) {
	top := completions(t)
	for _, want := range []string{"--root-dir", "--insecure-tcp", "plugins", "allocate", "completion", "version"} {
		if !slices.Contains(top, want) {
			t.Errorf("completions of nothing lack %s: %v", want, top)
		}
	}
	if got := completions(t, "--root-dir"); len(got) != 0 {
		t.Errorf("after --root-dir (a value): %v, want none", got)
	}
	if got := completions(t, "--insecure-tcp"); !slices.Contains(got, "allocate") {
		t.Errorf("after --insecure-tcp (a bool): %v, want the commands", got)
	}
	rel := completions(t, "--root-dir", "/x", "release")
	for _, want := range []string{"--pod", "--container", "--timeout"} {
		if !slices.Contains(rel, want) {
			t.Errorf("release's completions lack %s: %v", want, rel)
		}
	}
	if slices.Contains(rel, "allocate") {
		t.Errorf("release's completions offer a command: %v", rel)
	}
	if got := completions(t, "release", "--pod"); len(got) != 0 {
		t.Errorf("after release --pod: %v, want none", got)
	}
	del := completions(t, "delete", "-n", "demo")
	for _, want := range []string{"--ignore-not-found", "--filename", "pod", "namespace", "resourceclaim", "devicetaintrule"} {
		if !slices.Contains(del, want) {
			t.Errorf("delete's completions lack %s: %v", want, del)
		}
	}
	for _, words := range [][]string{{"delete", "pod"}, {"delete", "-f", "x.yaml"}, {"delete", "--", "pod"}, {"apply"}} {
		if got := completions(t, words...); slices.Contains(got, "pod") {
			t.Errorf("after %q: %v, want no kind", words, got)
		}
	}
	if got := completions(t, "no-such-command"); len(got) != 0 {
		t.Errorf("after an unknown command: %v, want none", got)
	}
}

// TestBashCompletion sources nodeplugctl's bash completion in a real bash
// and completes as bash would: a command, a command's flag, a global flag
// before the command.
func TestBashCompletion(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	dir := testutil.TempDir(t)
	if err := stack.Build(context.Background(), dir, "nodeplugctl"); err != nil {
		t.Fatal(err)
	}
	script := `source <(nodeplugctl completion bash)
c() { COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMPREPLY=(); _nodeplugctl; echo "${COMPREPLY[*]}"; }
c nodeplugctl rel
c nodeplugctl release --con
c nodeplugctl --root-d
c nodeplugctl --root-dir /x allocate --mu
`
	cmd := exec.Command(bash, "-c", script)
	cmd.Env = append(os.Environ(), "PATH="+dir+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	want := []string{"release", "--container", "--root-dir", "--must-include"}
	if !slices.Equal(got, want) {
		t.Fatalf("bash completed %q, want %q", got, want)
	}
}
