package manager

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// Release frees the devices of a pod, or of one of its containers when
// container is set, and returns how many were freed: a device that an
// init container shared with other containers of its pod counts once, and
// is freed only when none of them holds it any more. Releasing what is not
// there frees nothing and succeeds. A Release that returns nil has made its
// change durable; one whose save fails is taken back: the pod holds its
// devices as before (in memory, and on disk once a write works), and the
// caller retries. The devices are free for another pod only once the
// release is durable. Release runs one at a time with the Allocate and
// the container start of each container it releases.
func (m *Manager) Release(ctx context.Context, pod, container string) (int64, error) {
	if err := bounds.PodUID(pod); err != nil {
		return 0, err
	}
	if err := bounds.ContainerName(container, true); err != nil {
		return 0, err
	}
	containers := []string{container}
	if container == "" {
		containers = m.podContainers(pod)
	}
	for _, c := range containers {
		unlock := m.containers.Lock(pod + "\x00" + c)
		defer unlock()
	}
	r := m.release(pod, containers)
	if len(r.allocs) == 0 {
		// Nothing to free here; but a change the answer depends on (an
		// Allocate taken back) may not be durable yet: make it so.
		if err := m.persist(); err != nil {
			return 0, fmt.Errorf("release not saved: %v: %w", err, errdefs.ErrInternal)
		}
		return 0, nil
	}
	if err := m.persist(); err != nil {
		if m.unrelease(r) {
			m.persistRollback(ctx, "release")
			return 0, fmt.Errorf("release of pod %s not saved, its devices stay allocated: %v: %w", bounds.Quote(pod), err, errdefs.ErrInternal)
		}
		// Another write made it durable meanwhile: released.
	}
	m.releaseDone(ctx, r)
	return r.n, nil
}

// releaseDone counts a durable release, logs it, and removes the CDI specs
// of the containers it emptied.
func (m *Manager) releaseDone(ctx context.Context, r *released) {
	for resource, n := range r.freed {
		m.metrics.released.WithLabelValues(resource).Add(float64(n))
	}
	if m.log.Enabled(ctx, slog.LevelDebug) {
		m.log.DebugContext(ctx, "devices released", "pod_uid", r.pod, "containers", r.containers, "devices", r.n)
	}
	m.removeSpecs(ctx, r.pod, r.containers)
}

// persistRollback writes a change taken back because its save failed, so
// that the journal holds the taking back after the change. When that write
// fails too it stays staged in the store and the next write takes it; the
// devices it frees stay taken until then.
func (m *Manager) persistRollback(ctx context.Context, what string) {
	if err := m.persist(); err != nil {
		m.log.ErrorContext(ctx, what+" not saved and taken back; the taking back is not saved yet either, the next write saves it", "error", err)
		m.persistSoon() // Run retries
	}
}
