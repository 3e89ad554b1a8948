package podworker

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// podRef names a pod.
type podRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Grace is the pod's termination grace period, in seconds: how long
	// its containers are given to stop when it is deleted.
	Grace int64 `json:"grace,omitempty"`
	// Devices: the pod has device-plugin resources, which the
	// devicemanager frees with it.
	Devices bool `json:"devices,omitempty"`
	// Ended: the pod ended and its claims are released; its containers
	// stay, with their logs, until it is deleted.
	Ended bool `json:"ended,omitempty"`
}

func (r podRef) key() string { return r.Namespace + "/" + r.Name }

// state is the pods whose claims the worker prepared, or was about to:
// a pod is recorded before its claims are prepared and forgotten once
// they are released, each change written to the file (a temporary file
// synced and renamed over it) before it is acted on.
type state struct {
	path string
	mu   sync.Mutex
	pods map[types.UID]podRef
}

// stateFile is the file's form.
type stateFile struct {
	Pods map[types.UID]podRef `json:"pods"`
}

func loadState(path string) (*state, error) {
	s := &state{path: path, pods: map[types.UID]podRef{}}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return s, nil
	case err != nil:
		return nil, fmt.Errorf("pod worker state: %w", err)
	}
	var f stateFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("pod worker state %s is damaged (%v): remove it with the dramanager stopped; pods deleted while it was down then keep their claims until released by hand", path, err)
	}
	if f.Pods != nil {
		s.pods = f.Pods
	}
	return s, nil
}

func (s *state) all() map[types.UID]podRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.pods)
}

func (s *state) get(uid types.UID) (podRef, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.pods[uid]
	return r, ok
}

func (s *state) add(uid types.UID, ref podRef) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, ok := s.pods[uid]; ok && old == ref {
		return nil
	}
	s.pods[uid] = ref
	if err := s.writeLocked(); err != nil {
		delete(s.pods, uid)
		return err
	}
	return nil
}

func (s *state) remove(uid types.UID) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	ref, ok := s.pods[uid]
	if !ok {
		return nil
	}
	delete(s.pods, uid)
	if err := s.writeLocked(); err != nil {
		s.pods[uid] = ref
		return err
	}
	return nil
}

func (s *state) writeLocked() error {
	data, err := json.Marshal(stateFile{Pods: s.pods})
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.path)
	tmp, err := os.CreateTemp(dir, ".pods-*.json")
	if err != nil {
		return fmt.Errorf("pod worker state: %w", err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("pod worker state: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("pod worker state: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("pod worker state: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("pod worker state: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("pod worker state: %w", err)
	}
	defer func() { _ = d.Close() }()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("pod worker state: %w", err)
	}
	return nil
}
