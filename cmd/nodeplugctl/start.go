package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
)

const startArgs = "--pod UID --container NAME [-o text|json|podman|docker]"

// The output formats of start: podman and docker print a container
// runtime's arguments.
var startOutputs = []string{"text", "json", "podman", "docker"}

// cmdStart tells the devicemanager that a container starts (its
// StartContainer: PreStartContainer on the plugins that ask for it, every
// CDI name resolved) and prints what a runtime needs to start it with its
// devices.
func cmdStart(ctx context.Context, c *cli, args []string) error {
	fs := c.flags("start", startArgs)
	out := c.outputFlag(fs, startOutputs...)
	pod, container := containerFlags(fs)
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if err := checkOutput(*out, startOutputs...); err != nil {
		return err
	}
	if *pod == "" || *container == "" {
		return usagef("--pod and --container are required")
	}
	resp, err := devicemanagerCall(ctx, c, fmt.Sprintf("start pod %s container %s", *pod, *container),
		func(ctx context.Context, cc *grpc.ClientConn) (*dmv1.StartContainerResponse, error) {
			return dmv1.NewDeviceManagerServiceClient(cc).StartContainer(ctx, &dmv1.StartContainerRequest{PodUid: *pod, ContainerName: *container})
		})
	if err != nil {
		return err
	}
	switch *out {
	case "json":
		return writeJSON(c.stdout, resp)
	case "podman", "docker":
		line, err := runtimeArgs(resp)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(c.stdout, line)
		return err
	default:
		return renderStart(c.stdout, resp)
	}
}

// containerFlags defines --pod and --container, both required, for a
// command about one container.
func containerFlags(fs *flag.FlagSet) (pod, container *string) {
	return fs.String("pod", "", "pod UID (required)"), fs.String("container", "", "container name (required)")
}

// renderStart prints the CDI devices to inject, one a line, and the
// resources whose plugins were told of the start.
func renderStart(w io.Writer, resp *dmv1.StartContainerResponse) error {
	fmt.Fprintf(w, "pod %s container %s: CDI devices (resolved in %s)\n", resp.GetPodUid(), resp.GetContainerName(), strings.Join(resp.GetCdiSpecDirs(), ", "))
	for _, d := range resp.GetCdiDevices() {
		fmt.Fprintf(w, "  %s\n", d)
	}
	if len(resp.GetCdiDevices()) == 0 {
		fmt.Fprintln(w, "  none: the container's devices need no edits")
	}
	if a := resp.GetEdits().GetAnnotations(); len(a) > 0 {
		fmt.Fprintf(w, "annotations: %s\n", keyValues(a))
	}
	pre := "none (no plugin asks for PreStartContainer)"
	if p := resp.GetPreStartedResources(); len(p) > 0 {
		pre = strings.Join(p, ", ")
	}
	_, err := fmt.Fprintf(w, "pre-started: %s\n", pre)
	return err
}

// runtimeArgs returns the arguments podman and Docker take to start the
// container with its devices, on one line: --device for each CDI name and
// --annotation for each annotation (in key order). The line is meant for
// an unquoted $(...), which splits words and expands file name patterns
// but removes no quotes: so instead of quoting, an argument with a
// character that either could change is refused.
func runtimeArgs(resp *dmv1.StartContainerResponse) (string, error) {
	var args []string
	for _, d := range resp.GetCdiDevices() {
		args = append(args, "--device", d)
	}
	a := resp.GetEdits().GetAnnotations()
	for _, k := range sortedKeys(a) {
		args = append(args, "--annotation", k+"="+a[k])
	}
	for _, arg := range args {
		if i := strings.IndexFunc(arg, unsafeInWord); i >= 0 {
			r, _ := utf8.DecodeRuneInString(arg[i:])
			return "", fmt.Errorf("argument %q holds %q, which $(...) would split or expand: use -o json (cdiDevices, edits.annotations) and quote it yourself",
				arg, r)
		}
	}
	return strings.Join(args, " "), nil
}

// unsafeInWord reports whether r could change an unquoted word of a
// command substitution's output (word splitting, file name patterns) or
// mean something to a shell when the line is pasted: anything but
// letters, digits and -_.:/=,@%+.
func unsafeInWord(r rune) bool {
	switch {
	case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		return false
	}
	return !strings.ContainsRune("-_.:/=,@%+", r)
}
