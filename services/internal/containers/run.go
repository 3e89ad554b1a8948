package containers

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// cleanupTimeout bounds the removal of a container that did not start,
// which goes on when the caller's context has ended.
const cleanupTimeout = time.Minute

// EnsureImage makes sure the image is present as the kubelet reads the
// pull policy: Never only looks (ErrImageNeverPull when the image is
// absent), IfNotPresent pulls an absent image, Always pulls every time.
// A failed pull is an error wrapping ErrImagePull and podman's. An empty
// policy is the API server's default: Always for an image tagged latest
// or not tagged, IfNotPresent otherwise.
func (p *Podman) EnsureImage(ctx context.Context, image, pullPolicy string) error {
	return ensureImage(ctx, image, pullPolicy, p.imageExists, func(ctx context.Context) error {
		_, err := p.command(ctx, "podman pull "+image, "pull", "--quiet", "--", image)
		return err
	})
}

// ensureImage makes sure the image is present as the kubelet reads the
// pull policy (see Podman.EnsureImage), with the runtime's exists and
// pull.
func ensureImage(ctx context.Context, image, pullPolicy string, exists func(context.Context, string) (bool, error), pull func(context.Context) error) error {
	if err := checkImage(image); err != nil {
		return err
	}
	policy, err := effectivePullPolicy(image, pullPolicy)
	if err != nil {
		return err
	}
	if policy != PullAlways {
		present, err := exists(ctx, image)
		if err != nil {
			return err
		}
		if present {
			return nil
		}
		if policy == PullNever {
			return fmt.Errorf("image %s: %w", image, ErrImageNeverPull)
		}
	}
	if err := pull(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrImagePull, err)
	}
	return nil
}

// imageExists is whether podman has the image (podman image exists exits
// with 1 when it has not).
func (p *Podman) imageExists(ctx context.Context, image string) (bool, error) {
	_, err := p.command(ctx, "podman image exists "+image, "image", "exists", "--", image)
	var ce *CommandError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ce) && ce.ExitCode() == 1:
		return false, nil
	}
	return false, err
}

func checkImage(image string) error {
	if image == "" || strings.HasPrefix(image, "-") || strings.ContainsAny(image, " \t\n") {
		return fmt.Errorf("invalid image name %q", image)
	}
	return nil
}

// effectivePullPolicy is the policy to follow for the image: the one
// given, or the API server's default when none is.
func effectivePullPolicy(image, policy string) (string, error) {
	switch policy {
	case PullAlways, PullIfNotPresent, PullNever:
		return policy, nil
	case "":
		if strings.Contains(image, "@") {
			return PullIfNotPresent, nil
		}
		last := image[strings.LastIndex(image, "/")+1:]
		if _, tag, ok := strings.Cut(last, ":"); ok && tag != "latest" {
			return PullIfNotPresent, nil
		}
		return PullAlways, nil
	}
	return "", fmt.Errorf("image pull policy %q: want %s, %s or %s", policy, PullAlways, PullIfNotPresent, PullNever)
}

// Run creates the container (podman create) and starts it (podman start),
// and returns its ID. The image must be present: it is never pulled
// here. When the start fails the created container is removed, so that
// no container is left that never ran, holding the name.
func (p *Podman) Run(ctx context.Context, s Spec) (string, error) {
	args, err := p.createArgs(s)
	if err != nil {
		return "", fmt.Errorf("container %s: %w", s.Name, err)
	}
	if s.LogPath != "" {
		// conmon does not make the log's directory: the start would fail.
		if err := os.MkdirAll(filepath.Dir(s.LogPath), 0o755); err != nil {
			return "", fmt.Errorf("container %s: the log's directory: %w", s.Name, err)
		}
	}
	out, err := p.command(ctx, "podman create --name "+s.Name+" "+s.Image, args...)
	if err != nil {
		if ctx.Err() != nil {
			// podman may have created the container before it was
			// sent SIGTERM, and printed its ID too late for us.
			return "", p.abandon(ctx, s.Name, err)
		}
		return "", err
	}
	id := lastLine(out)
	if id == "" {
		return "", p.abandon(ctx, s.Name, fmt.Errorf("podman create --name %s %s printed no container ID", s.Name, s.Image))
	}
	if _, err := p.command(ctx, "podman start "+s.Name, "start", "--", id); err != nil {
		return "", p.abandon(ctx, id, err)
	}
	return id, nil
}

// abandon removes the container Run could not start (ref: its ID or
// name), even though ctx has ended, and returns why it could not, err,
// joined with any error removing it.
func (p *Podman) abandon(ctx context.Context, ref string, err error) error {
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if rmErr := p.Remove(cleanup, ref); rmErr != nil {
		return errors.Join(err, fmt.Errorf("removing the container that did not start: %w", rmErr))
	}
	return err
}

// lastLine is the last line of output that is not blank, trimmed.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// createArgs are the arguments of podman create for s.
//
// Every flag is given as --flag=value, so that a value beginning with a
// dash is not read as a flag. The values of the flags podman reads as a
// comma-separated list (--annotation, --device, --log-opt) are quoted as
// one CSV field, so that a comma in them is kept. "--" ends the flags
// before the image; podman passes every argument after the image to the
// container, a second "--" included.
//
// Kubernetes' command and args: with a command, --entrypoint is set to it
// (a JSON array) and the args follow the image; podman then drops the
// image's CMD (checked with podman 4.3.1), so that no args means none.
// With args only, they follow the image, replacing its CMD and keeping
// its ENTRYPOINT.
func (p *Podman) createArgs(s Spec) ([]string, error) {
	args, err := createPrefix(s, p.network)
	if err != nil {
		return nil, err
	}
	labels, err := labelArgs(s.Labels)
	if err != nil {
		return nil, err
	}
	args = append(args, labels...)
	for _, k := range slices.Sorted(maps.Keys(s.Annotations)) {
		if k == "" || strings.Contains(k, "=") {
			return nil, fmt.Errorf("invalid annotation key %q", k)
		}
		args = append(args, "--annotation="+csvField(k+"="+s.Annotations[k]))
	}
	if s.LogPath != "" {
		if err := checkLogPath(s.LogPath); err != nil {
			return nil, err
		}
		args = append(args, "--log-driver=k8s-file", "--log-opt="+csvField("path="+s.LogPath))
	}
	devs, err := deviceArgs(s.CDIDevices, s.Devices)
	if err != nil {
		return nil, err
	}
	args = append(args, devs...)
	for _, m := range s.Mounts {
		v, err := volumeArg(m)
		if err != nil {
			return nil, err
		}
		args = append(args, v)
	}
	env, err := envArgs(s.Env)
	if err != nil {
		return nil, err
	}
	args = append(args, env...)
	if s.WorkingDir != "" {
		args = append(args, "--workdir="+s.WorkingDir)
	}
	if len(s.Command) > 0 {
		ep, err := jsonArray(s.Command)
		if err != nil {
			return nil, err
		}
		args = append(args, "--entrypoint="+ep)
	}
	return append(append(args, "--", s.Image), s.Args...), nil
}

// deviceArgs are the --device flags of the CDI devices, then of the host
// devices (host:container:permissions).
func deviceArgs(cdi []string, devices []Device) ([]string, error) {
	var args []string
	for _, d := range cdi {
		if d == "" || !strings.Contains(d, "=") {
			return nil, fmt.Errorf("CDI device %q is not a fully qualified name (vendor.com/class=name)", d)
		}
		args = append(args, "--device="+csvField(d))
	}
	for _, d := range devices {
		spec, err := deviceSpec(d.HostPath, d.ContainerPath, d.Permissions)
		if err != nil {
			return nil, err
		}
		args = append(args, "--device="+csvField(spec))
	}
	return args, nil
}

// deviceSpec is host:container:permissions, the value of a --device flag
// of a host device; ctr empty is host, perms empty "rwm".
func deviceSpec(host, ctr, perms string) (string, error) {
	if ctr == "" {
		ctr = host
	}
	if perms == "" {
		perms = "rwm"
	}
	if err := checkPaths("device", host, ctr); err != nil {
		return "", err
	}
	if strings.Trim(perms, "rwm") != "" {
		return "", fmt.Errorf("device %s: permissions %q are not of rwm", host, perms)
	}
	return host + ":" + ctr + ":" + perms, nil
}

// createPrefix is what both runtimes' create begins with, s's name and
// image checked: the command, no pull, the name and the network.
func createPrefix(s Spec, network string) ([]string, error) {
	if s.Name == "" || strings.HasPrefix(s.Name, "-") {
		return nil, fmt.Errorf("invalid container name %q", s.Name)
	}
	if err := checkImage(s.Image); err != nil {
		return nil, err
	}
	args := []string{"create", "--pull=never", "--name=" + s.Name}
	if network != "" {
		args = append(args, "--network="+network)
	}
	return args, nil
}

// labelArgs are the --label flags of labels, by key.
func labelArgs(labels map[string]string) ([]string, error) {
	var args []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if k == "" || strings.Contains(k, "=") {
			return nil, fmt.Errorf("invalid label key %q", k)
		}
		args = append(args, "--label="+k+"="+labels[k])
	}
	return args, nil
}

// envArgs are the --env flags of env, each KEY=VALUE: without "=" the
// runtime would copy the variable from its own environment.
func envArgs(env []string) ([]string, error) {
	var args []string
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, fmt.Errorf("env %q is not KEY=VALUE", e)
		}
		args = append(args, "--env="+e)
	}
	return args, nil
}

// checkLogPath checks Spec.LogPath.
func checkLogPath(path string) error {
	if !filepath.IsAbs(path) {
		return fmt.Errorf("log path %q is not absolute", path)
	}
	return nil
}

// volumeArg is the --volume flag of a bind mount.
func volumeArg(m Mount) (string, error) {
	if err := checkPaths("mount", m.HostPath, m.ContainerPath); err != nil {
		return "", err
	}
	v := "--volume=" + m.HostPath + ":" + m.ContainerPath
	if m.ReadOnly {
		v += ":ro"
	}
	return v, nil
}

// checkPaths checks a host and a container path joined by colons in a
// podman flag: absolute (a relative host path would name a volume), and
// without a colon of their own.
func checkPaths(what, host, ctr string) error {
	for _, p := range []string{host, ctr} {
		if !filepath.IsAbs(p) || strings.Contains(p, ":") {
			return fmt.Errorf("%s %s:%s: paths must be absolute, without a colon", what, host, ctr)
		}
	}
	return nil
}

// csvField quotes s as one field of a CSV record, as podman reads the
// values of its list flags.
func csvField(s string) string {
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	_ = w.Write([]string{s}) // writing to a bytes.Buffer does not fail
	w.Flush()
	return strings.TrimSuffix(b.String(), "\n")
}

// jsonArray is the JSON array of strs, as --entrypoint takes a command
// of several words.
func jsonArray(strs []string) (string, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(strs); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}
