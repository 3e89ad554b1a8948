package containers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// EnsureImage makes sure the image is present as the kubelet reads the
// pull policy, as Podman's does: Never only looks (ErrImageNeverPull when
// the image is absent), IfNotPresent pulls an absent image, Always pulls
// every time; an empty policy is the API server's default. A failed pull
// is an error wrapping ErrImagePull and docker's.
func (d *Docker) EnsureImage(ctx context.Context, image, pullPolicy string) error {
	if err := checkImage(image); err != nil {
		return err
	}
	policy, err := effectivePullPolicy(image, pullPolicy)
	if err != nil {
		return err
	}
	if policy != PullAlways {
		present, err := d.imageExists(ctx, image)
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
	if _, err := d.command(ctx, "docker pull "+image, "pull", "--quiet", "--", image); err != nil {
		return fmt.Errorf("%w: %w", ErrImagePull, err)
	}
	return nil
}

// imageExists is whether the engine has the image (docker image inspect
// says "No such image" when it has not).
func (d *Docker) imageExists(ctx context.Context, image string) (bool, error) {
	_, err := d.command(ctx, "docker image inspect "+image, "image", "inspect", "--format", "{{.Id}}", "--", image)
	switch {
	case err == nil:
		return true, nil
	case isDockerNoSuch(err):
		return false, nil
	}
	return false, err
}

// Run creates the container (docker create), starts it (docker start)
// and links its log from s.LogPath, and returns its ID. The image must be
// present: it is never pulled here. When a step fails the container is
// removed, so that none is left that never ran, holding the name.
func (d *Docker) Run(ctx context.Context, s Spec) (string, error) {
	args, err := d.createArgs(s)
	if err != nil {
		return "", fmt.Errorf("container %s: %w", s.Name, err)
	}
	out, err := d.command(ctx, "docker create --name "+s.Name+" "+s.Image, args...)
	if err != nil {
		if ctx.Err() != nil {
			// docker may have created the container before it was
			// sent SIGTERM, and printed its ID too late for us.
			return "", d.abandon(ctx, s.Name, err)
		}
		return "", err
	}
	id := lastLine(out)
	if id == "" {
		return "", d.abandon(ctx, s.Name, fmt.Errorf("docker create --name %s %s printed no container ID", s.Name, s.Image))
	}
	if _, err := d.command(ctx, "docker start "+s.Name, "start", "--", id); err != nil {
		return "", d.abandon(ctx, id, err)
	}
	if s.LogPath != "" {
		if err := d.linkLog(ctx, id, s.LogPath); err != nil {
			return "", d.abandon(ctx, id, fmt.Errorf("container %s: %w", s.Name, err))
		}
	}
	return id, nil
}

// abandon removes the container Run could not start (ref: its ID or
// name), even though ctx has ended, and returns why it could not, err,
// joined with any error removing it.
func (d *Docker) abandon(ctx context.Context, ref string, err error) error {
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if _, rmErr := d.command(cleanup, "docker rm "+ref, "rm", "--force", "--", ref); rmErr != nil && !isDockerNoSuch(rmErr) {
		return errors.Join(err, fmt.Errorf("removing the container that did not start: %w", rmErr))
	}
	return err
}

// LabelLogLink is the label carrying the path Run linked the container's
// log from (Spec.LogPath), for Remove to keep the log there.
const LabelLogLink = "io.nodeplug.log-link"

// createArgs are the arguments of docker create for s.
//
// Every flag is given as --flag=value, so that a value beginning with a
// dash is not read as a flag, and "--" ends the flags before the image;
// docker passes every argument after the image to the container.
//
// Kubernetes' command and args: docker's --entrypoint is one word, the
// executable, and giving it clears the image's CMD. With a command, its
// first word is the entrypoint, and its other words, then the args,
// follow the image: the container runs the same argv as with an
// entrypoint of the whole command. With args only, they follow the image,
// replacing its CMD and keeping its ENTRYPOINT.
func (d *Docker) createArgs(s Spec) ([]string, error) {
	if s.Name == "" || strings.HasPrefix(s.Name, "-") {
		return nil, fmt.Errorf("invalid container name %q", s.Name)
	}
	if err := checkImage(s.Image); err != nil {
		return nil, err
	}
	if len(s.Annotations) > 0 {
		// docker create --annotation needs API 1.43 (Docker 24); labels
		// are not the same thing, so none is put in their place.
		return nil, fmt.Errorf("annotations are not supported with docker")
	}
	args := []string{"create", "--pull=never", "--name=" + s.Name}
	if d.network != "" {
		args = append(args, "--network="+d.network)
	}
	labels := maps.Clone(s.Labels)
	if s.LogPath != "" {
		if err := checkLogPath(s.LogPath); err != nil {
			return nil, err
		}
		if labels == nil {
			labels = map[string]string{}
		}
		labels[LabelLogLink] = s.LogPath
		// The log linked: docker's json-file, whatever the engine's
		// default driver is.
		args = append(args, "--log-driver=json-file")
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		if k == "" || strings.Contains(k, "=") {
			return nil, fmt.Errorf("invalid label key %q", k)
		}
		args = append(args, "--label="+k+"="+labels[k])
	}
	edits, err := d.cdiArgs(s.CDIDevices)
	if err != nil {
		return nil, err
	}
	args = append(args, edits.devices...)
	hostDevs, err := dockerDeviceArgs(s.Devices)
	if err != nil {
		return nil, err
	}
	args = append(args, hostDevs...)
	for _, m := range s.Mounts {
		v, err := mountArg(m.HostPath, m.ContainerPath, m.ReadOnly)
		if err != nil {
			return nil, err
		}
		args = append(args, v)
	}
	args = append(args, edits.mounts...)
	for _, e := range s.Env {
		// Without "=" docker would copy the variable from its own
		// environment.
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return nil, fmt.Errorf("env %q is not KEY=VALUE", e)
		}
		args = append(args, "--env="+e)
	}
	// After the container's own: a CDI spec's variable wins, as when the
	// runtime applies the spec to the container's.
	args = append(args, edits.env...)
	args = append(args, edits.groups...)
	if s.WorkingDir != "" {
		args = append(args, "--workdir="+s.WorkingDir)
	}
	var cmd []string
	if len(s.Command) > 0 {
		if s.Command[0] == "" {
			return nil, fmt.Errorf("command %q: the executable is empty", s.Command)
		}
		args = append(args, "--entrypoint="+s.Command[0])
		cmd = append(cmd, s.Command[1:]...)
	}
	cmd = append(cmd, s.Args...)
	return append(append(args, "--", s.Image), cmd...), nil
}

// dockerDeviceArgs are the --device flags of host devices
// (host:container:permissions).
func dockerDeviceArgs(devices []Device) ([]string, error) {
	var args []string
	for _, d := range devices {
		a, err := deviceArg(d.HostPath, d.ContainerPath, d.Permissions)
		if err != nil {
			return nil, err
		}
		args = append(args, a)
	}
	return args, nil
}

// deviceArg is the --device flag of a host device; ctr empty is host,
// perms empty "rwm".
func deviceArg(host, ctr, perms string) (string, error) {
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
	return "--device=" + host + ":" + ctr + ":" + perms, nil
}

// mountArg is the --mount flag of a bind mount. docker reads --mount's
// value as a CSV record, so each field is quoted as one. Unlike --volume,
// --mount does not make a missing host path: it is an error, as with
// podman.
func mountArg(host, ctr string, readOnly bool) (string, error) {
	if err := checkPaths("mount", host, ctr); err != nil {
		return "", err
	}
	fields := []string{"type=bind", csvField("source=" + host), csvField("target=" + ctr)}
	if readOnly {
		fields = append(fields, "readonly")
	}
	return "--mount=" + strings.Join(fields, ","), nil
}

// checkLogPath checks Spec.LogPath.
func checkLogPath(path string) error {
	if !strings.HasPrefix(path, "/") {
		return fmt.Errorf("log path %q is not absolute", path)
	}
	return nil
}
