package containers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// List is every container, running or not, carrying the label key
// (docker ps --all --filter label=KEY; label may also be KEY=VALUE), as
// docker inspect describes them: times to the nanosecond.
func (d *Docker) List(ctx context.Context, label string) ([]State, error) {
	if label == "" {
		return nil, fmt.Errorf("list containers: no label key")
	}
	out, err := d.command(ctx, "docker ps --filter label="+label,
		"ps", "--all", "--quiet", "--no-trunc", "--filter=label="+label)
	if err != nil {
		return nil, err
	}
	ids := strings.Fields(string(out))
	if len(ids) == 0 {
		return []State{}, nil
	}
	list, err := d.inspect(ctx, ids...)
	if err != nil {
		return nil, fmt.Errorf("docker ps --filter label=%s: %w", label, err)
	}
	states := make([]State, 0, len(list))
	for _, c := range list {
		states = append(states, c.state())
	}
	return states, nil
}

// dockerContainer is what is read of a container in docker inspect's
// output.
type dockerContainer struct {
	ID    string `json:"Id"`
	Name  string // "/" and the name
	State struct {
		Status                string
		ExitCode              int
		StartedAt, FinishedAt string
	}
	Config struct {
		Labels map[string]string
	}
	LogPath string
}

// inspect describes the containers ids. One removed meanwhile is left
// out: docker inspect describes the others and says it has no such
// container.
func (d *Docker) inspect(ctx context.Context, ids ...string) ([]dockerContainer, error) {
	out, err := d.command(ctx, "docker inspect "+strings.Join(ids, " "),
		append([]string{"container", "inspect", "--"}, ids...)...)
	if err != nil && !isDockerNoSuch(err) {
		return nil, err
	}
	var list []dockerContainer
	if len(bytes.TrimSpace(out)) > 0 {
		if jerr := json.Unmarshal(out, &list); jerr != nil {
			return nil, errors.Join(err, fmt.Errorf("reading docker inspect's JSON: %w: %q", jerr, clipOutput(out)))
		}
	}
	return list, nil
}

func (c dockerContainer) state() State {
	s := State{
		ID: c.ID, Name: strings.TrimPrefix(c.Name, "/"), Labels: c.Config.Labels,
		Status:    dockerStatus(c.State.Status),
		StartedAt: dockerTime(c.State.StartedAt), FinishedAt: dockerTime(c.State.FinishedAt),
	}
	if s.Status == StatusExited {
		s.ExitCode = c.State.ExitCode
		// The engine stamps a start when its start call returns and an
		// exit when the runtime reports it: a process that ends at once
		// can have finished "before" it started. It ended no earlier
		// than it started.
		if !s.StartedAt.IsZero() && s.FinishedAt.Before(s.StartedAt) {
			s.FinishedAt = s.StartedAt
		}
	} else {
		// docker keeps the finish time of a start before.
		s.FinishedAt = time.Time{}
	}
	return s
}

// dockerStatus is the Status of a state of docker's (State.Status).
func dockerStatus(state string) Status {
	switch state {
	case "created":
		return StatusCreated
	case "running", "paused", "restarting":
		// The container's processes exist, or are started again by
		// docker (a restart policy; none is set here).
		return StatusRunning
	case "exited", "dead", "removing":
		return StatusExited
	}
	return StatusUnknown
}

// dockerTime is a time docker gives (RFC 3339); the zero time for none
// (docker's 0001-01-01T00:00:00Z) or one that does not parse.
func dockerTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || t.Year() <= 1 {
		return time.Time{}
	}
	return t.UTC()
}

// Stop stops the container (docker stop --time): the image's stop signal
// (SIGTERM unless it names another), then SIGKILL when the container is
// still running after grace, rounded up to a whole second. A container
// docker does not have is an error wrapping ErrNotFound; one that has
// already exited is not an error.
func (d *Docker) Stop(ctx context.Context, id string, grace time.Duration) error {
	if id == "" {
		return fmt.Errorf("stop: no container ID: %w", ErrNotFound)
	}
	secs := max(0, int64(grace/time.Second))
	if grace > 0 && grace%time.Second != 0 {
		secs++
	}
	_, err := d.command(ctx, "docker stop "+id, "stop", "--time="+strconv.FormatInt(secs, 10), "--", id)
	if isDockerNoSuch(err) {
		return fmt.Errorf("%w: %w", ErrNotFound, err)
	}
	return err
}

// Remove removes the container (docker rm --force), killing it at once
// when it runs. A container already gone is not an error. Its log, linked
// by Run, is kept: the link is replaced by a copy of the log before
// docker removes the container, and the log with it.
func (d *Docker) Remove(ctx context.Context, id string) error {
	if id == "" {
		return fmt.Errorf("remove: no container ID")
	}
	list, err := d.inspect(ctx, id)
	if err != nil {
		return err
	}
	if len(list) == 0 {
		return nil
	}
	c := list[0]
	if link := c.Config.Labels[LabelLogLink]; link != "" && c.LogPath != "" {
		if dockerStatus(c.State.Status) != StatusExited {
			// Ended first, so that the copy has all of its output.
			_, err := d.command(ctx, "docker stop "+id, "stop", "--time=0", "--", id)
			if isDockerNoSuch(err) {
				return nil
			}
			if err != nil {
				return err
			}
		}
		if err := keepLog(link, c.LogPath); err != nil {
			return fmt.Errorf("keeping the log of container %s: %w", strings.TrimPrefix(c.Name, "/"), err)
		}
	}
	_, err = d.command(ctx, "docker rm "+id, "rm", "--force", "--", id)
	if isDockerNoSuch(err) {
		return nil
	}
	return err
}

// linkLog links the container's log (docker inspect's LogPath) from
// path, replacing what is there, making path's directory when missing.
func (d *Docker) linkLog(ctx context.Context, id, path string) error {
	list, err := d.inspect(ctx, id)
	if err != nil {
		return err
	}
	if len(list) == 0 || list[0].LogPath == "" {
		return fmt.Errorf("docker names no log file of the container (its log driver is not json-file?)")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("the log's directory: %w", err)
	}
	tmp := path + ".link-" + strconv.Itoa(os.Getpid())
	_ = os.Remove(tmp) // one a killed predecessor of the same PID left
	if err := os.Symlink(list[0].LogPath, tmp); err != nil {
		return fmt.Errorf("linking the log: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("linking the log: %w", err)
	}
	return nil
}

// keepLog replaces the link at path to the log target by a copy of it.
// Anything else at path (a copy already, nothing) is left as it is.
func keepLog(path, target string) error {
	if dest, err := os.Readlink(path); err != nil || dest != target {
		return nil
	}
	src, err := os.Open(target)
	if errors.Is(err, os.ErrNotExist) {
		// The link dangles already: the log is lost, not for Remove to
		// fail over.
		return nil
	}
	if err != nil {
		return err
	}
	defer func() { _ = src.Close() }()
	tmp, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".copy-*")
	if err != nil {
		return err
	}
	_, err = io.Copy(tmp, src)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o640)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}
