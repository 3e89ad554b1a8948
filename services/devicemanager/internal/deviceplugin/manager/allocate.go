package manager

// The allocation flow, a client of the state core. An Allocate for a
// container:
//  1. returns the saved answer when the same request was made before (the
//     plugin is not called again);
//  2. chooses, per resource, healthy free devices, the must-include ones
//     first, then those of the pod's init containers that the container
//     may share, as the kubelet reuses them (allocator.ContainerKind;
//     package allocator, from a snapshot the core gives it): when
//     the plugin offers GetPreferredAllocation, then the answered IDs that
//     are available, in its order, and the rest by default (the kubelet's
//     devicesToAllocate: a short, empty or foreign answer is logged, not an
//     error); else the lowest IDs in sorted order;
//  3. reserves them before any plugin call, so two concurrent requests
//     never get the same device;
//  4. calls the plugin's Allocate (PreStartContainer belongs to the
//     container's start: start.go);
//  5. records the allocation and makes it durable before it returns, then
//     writes the container's CDI spec (start.go).
//
// Any failure releases every reservation of the request: nothing stays
// allocated. An allocation whose save failed is taken back, but its devices
// stay taken until the taking back is durable (core_unsaved.go). Allocate calls for the same pod and container run one at a
// time, so concurrent identical requests yield one allocation; other calls
// run concurrently.

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"google.golang.org/protobuf/proto"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/telemetry"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/endpoint"
)

// maxPickAttempts bounds how often a choice made with no lock held
// (GetPreferredAllocation) is retried when a concurrent allocation took one
// of its devices.
const maxPickAttempts = 5

// Allocate gives devices to one container (see above). An Allocate that
// returns nil has made its change durable.
func (m *Manager) Allocate(ctx context.Context, req *allocator.Request) ([]allocator.ResourceAllocation, error) {
	if err := allocator.ValidateRequest(req); err != nil {
		return nil, err
	}
	ctx, span := tracer.Start(ctx, "allocate")
	defer span.End()
	span.SetAttributes(attribute.String("pod_uid", req.PodUID), attribute.String("container", req.Container))
	resp, err := m.allocate(ctx, req)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		// Metric labels only name registered resources, never what a
		// caller asked for.
		for _, rr := range req.Resources {
			if m.known(rr.Name) {
				m.metrics.allocations.WithLabelValues(rr.Name, "failed").Inc()
			}
		}
		return nil, err
	}
	return resp, nil
}

func (m *Manager) allocate(ctx context.Context, req *allocator.Request) ([]allocator.ResourceAllocation, error) {
	unlock := m.containers.Lock(req.PodUID + "\x00" + req.Container)
	defer unlock()

	want := podIdentity{req.PodNamespace, req.PodName}
	todo, err := m.pending(req, want)
	if err != nil {
		return nil, err
	}
	var picks []*pick
	for _, rr := range todo {
		p, err := m.reservePick(ctx, allocKey{req.PodUID, req.Container, rr.Name}, req.Kind, rr)
		if err != nil {
			m.unreserve(picks)
			return nil, err
		}
		picks = append(picks, p)
	}
	for _, p := range picks {
		if err := m.callPlugin(ctx, p); err != nil {
			m.unreserve(picks)
			return nil, err
		}
	}
	if len(picks) > 0 {
		if err := m.commitDurably(ctx, want, picks); err != nil {
			return nil, err
		}
		m.writeSpec(ctx, req.PodUID, req.Container)
	}
	out, err := m.allocated(req)
	if err != nil {
		return nil, err
	}
	if len(picks) == 0 {
		for _, rr := range req.Resources {
			m.metrics.allocations.WithLabelValues(rr.Name, "reused").Inc()
		}
	}
	return out, nil
}

// reservePick chooses and reserves devices for one resource (core.choose). A
// choice the plugin prefers is made with no lock held, and retried when a
// concurrent allocation took one of its devices meanwhile.
func (m *Manager) reservePick(ctx context.Context, k allocKey, kind allocator.ContainerKind, rr allocator.ResourceRequest) (*pick, error) {
	for attempt := 1; ; attempt++ {
		plugin, ids, offer, err := m.choose(k, kind, rr)
		if err != nil {
			return nil, err
		}
		if ids != nil {
			return &pick{key: k, kind: kind, ids: ids, plugin: plugin}, nil
		}
		ids, err = m.preferred(ctx, plugin, offer.Available, offer.MustInclude, int(rr.Count))
		if err != nil {
			return nil, err
		}
		if m.reserveIfFree(k, kind, ids) {
			return &pick{key: k, kind: kind, ids: ids, plugin: plugin}, nil
		}
		if attempt == maxPickAttempts {
			return nil, fmt.Errorf("devices of %s preferred by its plugin were taken concurrently %d times: %w", k.resource, attempt, errdefs.ErrFailedPrecondition)
		}
	}
}

// preferred asks the plugin for its choice among avail (sorted) and makes
// it as the kubelet does (allocator.MergePreferred); what was wrong with
// the answer is logged at warn, naming the plugin. Only a failed call
// fails the allocation.
func (m *Manager) preferred(ctx context.Context, plugin endpoint.Plugin, avail, must []string, count int) ([]string, error) {
	answer, err := plugin.GetPreferredAllocation(ctx, avail, must, count)
	if err != nil {
		return nil, err
	}
	ids, problems := allocator.MergePreferred(answer, avail, must, count)
	if len(problems) > 0 {
		m.log.WarnContext(ctx, "device plugin's preferred allocation not used as answered; the rest chosen by default",
			"plugin", plugin.String(), "answer", bounds.Quote(fmt.Sprint(answer)), "problems", problems, "devices", ids)
	}
	return ids, nil
}

// callPlugin runs the plugin's Allocate.
func (m *Manager) callPlugin(ctx context.Context, p *pick) error {
	start := time.Now()
	resp, err := p.plugin.Allocate(ctx, p.ids)
	m.metrics.allocDuration.WithLabelValues(p.key.resource).Observe(time.Since(start).Seconds())
	if err != nil {
		return err
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(resp)
	if err != nil {
		return fmt.Errorf("device plugin %s: encode allocation response: %v: %w", p.plugin, err, errdefs.ErrInternal)
	}
	p.resp, p.respBytes = resp, b
	return nil
}

// commitDurably records the allocations of picks (core.commit) and makes
// them durable; when they cannot be saved it takes them back.
func (m *Manager) commitDurably(ctx context.Context, want podIdentity, picks []*pick) error {
	if err := m.commit(want, picks, telemetry.TraceID(ctx), time.Now()); err != nil {
		return err
	}
	if err := m.persist(); err != nil {
		// Taken back in memory; the devices stay taken until the
		// removal is durable too (core_unsaved.go).
		m.uncommit(picks)
		m.persistRollback(ctx, "allocation")
		return fmt.Errorf("allocation not saved: %v: %w", err, errdefs.ErrInternal)
	}
	// Debug, as the kubelet logs each allocation at verbosity 3: the
	// metrics count them; ListAllocations and the trace show each one.
	// Checked first: the arguments alone, boxed for the call, are
	// allocations that the logger would discard.
	debug := m.log.Enabled(ctx, slog.LevelDebug)
	for _, p := range picks {
		m.metrics.allocations.WithLabelValues(p.key.resource, "allocated").Inc()
		if debug {
			m.log.DebugContext(ctx, "devices allocated", "pod_uid", p.key.pod, "container", p.key.container,
				"resource", p.key.resource, "devices", p.ids)
		}
	}
	return nil
}
