package containers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
)

// EnsureImage makes sure the image is present as the kubelet reads the
// pull policy, as Podman's does: Never only looks (ErrImageNeverPull when
// the image is absent), IfNotPresent pulls an absent image, Always pulls
// every time; an empty policy is the API server's default. A failed pull
// is an error wrapping ErrImagePull and docker's.
func (d *Docker) EnsureImage(ctx context.Context, image, pullPolicy string) error {
	return ensureImage(ctx, image, pullPolicy, d.imageExists, func(ctx context.Context) error {
		_, err := d.command(ctx, "docker pull "+image, "pull", "--quiet", "--", image)
		return err
	})
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
	if len(s.Annotations) > 0 {
		// docker create --annotation needs API 1.43 (Docker 24); labels
		// are not the same thing, so none is put in their place.
		return nil, fmt.Errorf("annotations are not supported with docker")
	}
	args, err := createPrefix(s, d.network)
	if err != nil {
		return nil, err
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
	labelFlags, err := labelArgs(labels)
	if err != nil {
		return nil, err
	}
	args = append(args, labelFlags...)
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
	env, err := envArgs(s.Env)
	if err != nil {
		return nil, err
	}
	args = append(args, env...)
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

// deviceArg is the --device flag of a host device (deviceSpec).
func deviceArg(host, ctr, perms string) (string, error) {
	spec, err := deviceSpec(host, ctr, perms)
	if err != nil {
		return "", err
	}
	return "--device=" + spec, nil
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
