package containers

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"
)

// List is every container, running or not, carrying the label key
// (podman ps --all --filter label=KEY; label may also be KEY=VALUE).
//
// podman's listing has the start and finish times to the second only.
func (p *Podman) List(ctx context.Context, label string) ([]State, error) {
	if label == "" {
		return nil, fmt.Errorf("list containers: no label key")
	}
	out, err := p.command(ctx, "podman ps --filter label="+label,
		"ps", "--all", "--filter="+csvField("label="+label), "--format=json")
	if err != nil {
		return nil, err
	}
	states, err := parsePS(out)
	if err != nil {
		return nil, fmt.Errorf("podman ps --filter label=%s: %w", label, err)
	}
	return states, nil
}

// psContainer is what is read of a container in the output of podman ps
// --format json. In podman 4.3.1 StartedAt and ExitedAt are Unix times in
// seconds, and the zero time.Time's (-62135596800) when the container has
// not started or not exited.
type psContainer struct {
	ID        string `json:"Id"`
	Names     []string
	Labels    map[string]string
	State     string
	ExitCode  int
	StartedAt int64
	ExitedAt  int64
}

// parsePS reads the output of podman ps --format json: a JSON array, or
// nothing when there are no containers.
func parsePS(out []byte) ([]State, error) {
	var list []psContainer
	if len(bytes.TrimSpace(out)) > 0 {
		if err := json.Unmarshal(out, &list); err != nil {
			return nil, fmt.Errorf("reading its JSON: %w: %q", err, clipOutput(out))
		}
	}
	states := make([]State, 0, len(list))
	for _, c := range list {
		s := State{
			ID: c.ID, Labels: c.Labels, Status: podmanStatus(c.State),
			StartedAt: unixTime(c.StartedAt), FinishedAt: unixTime(c.ExitedAt),
		}
		if len(c.Names) > 0 {
			s.Name = c.Names[0]
		}
		if s.Status == StatusExited {
			s.ExitCode = c.ExitCode
		}
		states = append(states, s)
	}
	return states, nil
}

// unixTime is the time of a Unix time in seconds from podman; the zero
// time for none (podman's zero time is before 1970).
func unixTime(sec int64) time.Time {
	if sec <= 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0).UTC()
}

// podmanStatus is the Status of a state of libpod's (define.ContainerStatus
// as a string).
func podmanStatus(state string) Status {
	switch state {
	case "created", "configured", "initialized":
		return StatusCreated
	case "running", "paused", "stopping":
		// Paused or being stopped, the container's processes still exist.
		return StatusRunning
	case "exited", "stopped":
		// stopped: the processes have exited, podman has not cleaned up
		// after them yet.
		return StatusExited
	}
	return StatusUnknown
}

// Stop stops the container (podman stop --time): the image's stop signal
// (SIGTERM unless it names another), then SIGKILL when the container is
// still running after grace, rounded up to a whole second. A container
// podman does not have is an error wrapping ErrNotFound; one that has
// already exited is not an error.
func (p *Podman) Stop(ctx context.Context, id string, grace time.Duration) error {
	if id == "" {
		return fmt.Errorf("stop: no container ID: %w", ErrNotFound)
	}
	secs := max(0, int64(grace/time.Second))
	if grace > 0 && grace%time.Second != 0 {
		secs++
	}
	_, err := p.command(ctx, "podman stop "+id, "stop", "--time="+strconv.FormatInt(secs, 10), "--", id)
	if isNoSuchContainer(err) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

// Remove removes the container (podman rm --force), killing it at once
// when it runs. A container already gone is not an error.
func (p *Podman) Remove(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("remove: no container ID")
	}
	_, err := p.command(ctx, "podman rm "+id, "rm", "--force", "--time=0", "--", id)
	if isNoSuchContainer(err) {
		return nil
	}
	return err
}
