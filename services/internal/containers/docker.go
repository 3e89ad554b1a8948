package containers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// DockerConfig says how to run docker.
type DockerConfig struct {
	// Path is the docker executable (the CLI), or a program that runs it
	// with the same arguments. Empty: docker, looked up on PATH.
	Path string
	// Args are global arguments, put before every subcommand (--host,
	// --context, --config and the like).
	Args []string
	// Env is added to the environment docker runs with (os.Environ),
	// such as DOCKER_HOST.
	Env []string
	// Network is the network mode of every container (docker's
	// --network: "none", "host", "bridge", ...). Empty: docker's default.
	Network string
	// CDISpecDirs are where CDI device names are resolved when the
	// engine does not resolve them itself (see Docker). Empty: CDI's
	// default directories, /etc/cdi and /var/run/cdi.
	CDISpecDirs []string
}

// Docker is a Runtime driving docker's command line, one docker command
// per operation. It keeps no state of its own: the engine holds the
// containers, so several Dockers (and processes) may share it, and a
// Docker started anew finds the containers an earlier one ran.
//
// CDI devices: an engine with CDI enabled (Docker 25 and later with the
// "cdi" feature set in daemon.json, 28 and later by default: docker info
// then lists its CDI spec directories) is given their names (docker run
// --device vendor/class=name) and resolves them in its own directories.
// An engine without resolves none, so Docker does it: it reads the specs
// in DockerConfig.CDISpecDirs and gives the engine what they add, as
// docker's own flags: the device nodes as --device, the mounts as bind
// mounts, the environment, the additional groups. A spec with what those
// flags cannot carry (OCI hooks, network devices, Intel RDT) is refused
// then: the engine's CDI support is needed for it.
//
// Logs: docker has no option for a container's log path. Its json-file
// driver's log (docker inspect's LogPath) is linked from Spec.LogPath, as
// the kubelet's dockershim linked it from /var/log/pods, and package
// podlogs reads its lines. As docker removes the file with the container,
// Remove first puts a copy of it in place of the link, so that an ended
// container's log outlives it, as with podman.
type Docker struct {
	cli
	network string
	version string
	// engineCDI is whether the engine resolves CDI device names.
	engineCDI bool
	cdiDirs   []string
}

var _ Runtime = (*Docker)(nil)

// NewDocker checks that docker answers, asking the engine's version (the
// client alone answering is not enough), and whether the engine resolves
// CDI device names, and returns a Docker running it as cfg says.
func NewDocker(cfg DockerConfig) (*Docker, error) {
	path := cfg.Path
	if path == "" {
		var err error
		if path, err = exec.LookPath("docker"); err != nil {
			return nil, fmt.Errorf("docker is not installed: %w", err)
		}
	}
	d := &Docker{
		cli: cli{path: path, args: slices.Clone(cfg.Args), env: slices.Clone(cfg.Env)}, network: cfg.Network,
		cdiDirs: slices.Clone(cfg.CDISpecDirs),
	}
	if len(d.cdiDirs) == 0 {
		d.cdiDirs = slices.Clone(cdi.DefaultSpecDirs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), versionTimeout)
	defer cancel()
	out, err := d.command(ctx, "docker version", "version", "--format", "{{json .Server}}")
	if err != nil {
		return nil, fmt.Errorf("docker (%s) does not answer: %w", path, err)
	}
	if d.version, err = parseDockerVersion(out); err != nil {
		return nil, fmt.Errorf("docker (%s): %w", path, err)
	}
	// The whole of it: a client older than the field would refuse a
	// template naming it.
	out, err = d.command(ctx, "docker info", "info", "--format", "{{json .}}")
	if err != nil {
		return nil, fmt.Errorf("docker (%s) does not answer: %w", path, err)
	}
	var info struct{ CDISpecDirs []string }
	if err := json.Unmarshal(bytes.TrimSpace(out), &info); err != nil {
		return nil, fmt.Errorf("docker (%s): reading docker info: %w: %q", path, err, clipOutput(out))
	}
	// The engine lists its directories when CDI is enabled, none when it
	// is not (and an engine or a client before API 1.46 has no such
	// field).
	d.engineCDI = len(info.CDISpecDirs) > 0
	return d, nil
}

// parseDockerVersion reads the output of docker version --format
// '{{json .Server}}': the engine's version. null: the client did not
// reach the engine.
func parseDockerVersion(out []byte) (string, error) {
	var v *struct{ Version string }
	if err := json.Unmarshal(bytes.TrimSpace(out), &v); err != nil {
		return "", fmt.Errorf("reading docker version's server: %w: %q", err, clipOutput(out))
	}
	if v == nil || v.Version == "" {
		return "", fmt.Errorf("docker version names no engine version: %q", clipOutput(out))
	}
	return v.Version, nil
}

// Name is "docker <the engine's version>".
func (d *Docker) Name() string { return "docker " + d.version }

// EngineCDI says whether the engine resolves CDI device names itself;
// when not, Docker resolves them in its CDI spec directories.
func (d *Docker) EngineCDI() bool { return d.engineCDI }

// dockerNoSuch is in docker's message about a container, image or object
// it does not have ("No such container: x", "No such image: x", "No such
// object: x").
const dockerNoSuch = "no such "

// isDockerNoSuch is whether err is docker saying, on every line of its
// standard error, that it has no such thing.
func isDockerNoSuch(err error) bool {
	var ce *CommandError
	if !errors.As(err, &ce) || ce.Stderr == "" {
		return false
	}
	for _, line := range strings.Split(ce.Stderr, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.Contains(strings.ToLower(line), dockerNoSuch) {
			return false
		}
	}
	return true
}
