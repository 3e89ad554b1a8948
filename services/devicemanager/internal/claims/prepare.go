package claims

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	resourcev1 "k8s.io/api/resource/v1"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/store"
)

// unreserveTimeout bounds the removal of a failed prepare's reservations.
const unreserveTimeout = 30 * time.Second

// Prepare prepares the claims of a pod and returns, per container of the
// request, the CDI device IDs of the claims and requests it references.
//
// A claim already recorded with the pod is used as recorded: the same
// call again reads nothing and calls no driver. A claim recorded for
// other pods is reserved for this one too and not prepared again. The
// others are reserved (allocated on this node when nobody allocated them),
// grouped by driver and sent to NodePrepareResources; a claim is recorded
// as prepared, with the pod, once every driver of its devices succeeded,
// and the records are durable before Prepare returns.
//
// A failure fails the whole call and is retryable. What did succeed stays
// recorded with the pod (the claims prepared by the same driver call, the
// recorded claims the pod was added to), so the retry calls no driver for
// them and releasing the pod unprepares them; the claims that failed are
// unprepared and their reservation for the pod is removed (which
// deallocates a claim this node allocated for it alone) — or, when their
// driver cannot be reached for that, recorded as unpreparing until it can
// (see abandon). A driver's error
// for a claim is errdefs.ErrUnavailable with the driver's message; a
// claim being unprepared is errdefs.ErrUnavailable too.
func (m *Manager) Prepare(ctx context.Context, req PrepareRequest) ([]ContainerResult, error) {
	if err := validate(&req); err != nil {
		return nil, err
	}
	ctx, span := tracer.Start(ctx, "prepare pod "+req.Pod.Namespace+"/"+req.Pod.Name, trace.WithAttributes(
		attribute.String("pod.uid", req.Pod.UID), attribute.Int("pod.claims", len(req.PodClaims))))
	defer span.End()
	out, called, err := m.prepare(ctx, req)
	result := "reused"
	switch {
	case err != nil:
		result = "failed"
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		m.log.WarnContext(ctx, "prepare failed", "pod_uid", req.Pod.UID, "pod", req.Pod.Namespace+"/"+req.Pod.Name, "error", err)
	case called:
		result = "prepared"
	}
	span.SetAttributes(attribute.Bool("drivers.called", called))
	m.metrics.prepares.WithLabelValues(result).Inc()
	return out, err
}

func (m *Manager) prepare(ctx context.Context, req PrepareRequest) ([]ContainerResult, bool, error) {
	names := make([]string, 0, len(req.PodClaims))
	for _, pc := range req.PodClaims {
		names = append(names, pc.ResourceClaimName)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	for _, n := range names {
		unlock := m.locks.Lock(key(req.Pod.Namespace, n))
		defer unlock()
	}
	uses := usesOf(&req)
	podOf := func(claim string) store.ClaimPod {
		return store.ClaimPod{UID: req.Pod.UID, Namespace: req.Pod.Namespace, Name: req.Pod.Name, Containers: uses[claim]}
	}
	recs := make(map[string]store.Claim, len(names)) // by claim name
	var put []store.Claim
	var fresh []*resourcev1.ResourceClaim
	var err error
	for _, n := range names {
		rec, lastErr, ok := m.lookup(req.Pod.Namespace, n)
		switch {
		case ok && rec.State == store.ClaimUnpreparing:
			err = fmt.Errorf("ResourceClaim %s/%s is being unprepared (last error: %q); retry once it is gone: %w",
				req.Pod.Namespace, n, lastErr, errdefs.ErrUnavailable)
		case ok && hasPod(rec.Pods, req.Pod.UID):
			recs[n] = rec
			continue
		}
		if err != nil {
			break
		}
		ref := ClaimRef{Namespace: req.Pod.Namespace, Name: n, UID: rec.UID}
		obj, rerr := m.cfg.Reserver.Reserve(ctx, req.Pod, ref)
		if rerr != nil {
			err = fmt.Errorf("reserve ResourceClaim %s/%s: %w", ref.Namespace, ref.Name, rerr)
			break
		}
		if !ok {
			fresh = append(fresh, obj)
			continue
		}
		if string(obj.UID) != rec.UID {
			err = fmt.Errorf("ResourceClaim %s/%s has UID %s, but the one prepared here (UID %s) is still in use: %w",
				ref.Namespace, ref.Name, obj.UID, rec.UID, errdefs.ErrFailedPrecondition)
			break
		}
		rec.Pods = append(rec.Pods, podOf(n))
		rec.Released = slices.DeleteFunc(rec.Released, func(p store.ClaimPod) bool { return p.UID == req.Pod.UID })
		recs[n] = rec
		put = append(put, rec)
	}
	var prepared []store.Claim
	var failed []*resourcev1.ResourceClaim
	if err == nil && len(fresh) > 0 {
		prepared, failed, err = m.callDrivers(ctx, fresh, podOf)
	} else {
		failed = fresh
	}
	for _, c := range prepared {
		recs[c.Name] = c
	}
	put = append(put, prepared...)
	if cerr := m.commit(put, nil); cerr != nil {
		// Nothing of this call is recorded: every claim it reserved is
		// released again, the prepared ones are prepared again by the
		// retry (drivers treat a repeated prepare as a no-op).
		err = errors.Join(err, cerr)
		failed = fresh
	}
	if err != nil {
		m.abandon(ctx, req.Pod, failed, podOf)
		return nil, len(fresh) > 0, err
	}
	return answer(&req, recs), len(fresh) > 0, nil
}

// callDrivers prepares fresh claims for pod: each driver once, with the
// claims that have its devices. A claim is prepared when all its drivers
// succeeded for it.
func (m *Manager) callDrivers(ctx context.Context, fresh []*resourcev1.ResourceClaim, podOf func(claim string) store.ClaimPod) (prepared []store.Claim, failed []*resourcev1.ResourceClaim, err error) {
	byDriver := map[string][]ClaimRef{}
	recs := make(map[string]*store.Claim, len(fresh))
	for _, obj := range fresh {
		rec := &store.Claim{UID: string(obj.UID), Namespace: obj.Namespace, Name: obj.Name, State: store.ClaimPrepared,
			Pods: []store.ClaimPod{podOf(obj.Name)}, Devices: []store.ClaimDevice{}}
		if m.cfg.AllocatedHere != nil {
			rec.AllocatedHere = m.cfg.AllocatedHere(obj)
		}
		recs[rec.UID] = rec
		for _, d := range claimDrivers(obj) {
			rec.Drivers = append(rec.Drivers, d)
			byDriver[d] = append(byDriver[d], ClaimRef{Namespace: obj.Namespace, Name: obj.Name, UID: rec.UID})
		}
	}
	errs := map[string][]string{} // claim UID → failures
	var callErrs []error
	for _, driver := range slices.Sorted(maps.Keys(byDriver)) {
		refs := byDriver[driver]
		res, cerr := m.cfg.Drivers.Prepare(ctx, driver, refs)
		for _, ref := range refs {
			r, ok := res[ref.UID]
			switch {
			case cerr != nil:
				errs[ref.UID] = append(errs[ref.UID], cerr.Error())
				callErrs = append(callErrs, fmt.Errorf("prepare ResourceClaim %s/%s: driver %s: %w", ref.Namespace, ref.Name, driver, cerr))
			case !ok:
				errs[ref.UID] = append(errs[ref.UID], "no result")
				callErrs = append(callErrs, fmt.Errorf("prepare ResourceClaim %s/%s: driver %s answered nothing for it: %w", ref.Namespace, ref.Name, driver, errdefs.ErrUnavailable))
			case r.Err != nil:
				errs[ref.UID] = append(errs[ref.UID], r.Err.Error())
				callErrs = append(callErrs, fmt.Errorf("prepare ResourceClaim %s/%s: driver %s: %v: %w", ref.Namespace, ref.Name, driver, r.Err, errdefs.ErrUnavailable))
			default:
				for _, d := range r.Devices {
					recs[ref.UID].Devices = append(recs[ref.UID].Devices, store.ClaimDevice{
						Requests: slices.Clone(d.Requests), Driver: d.Driver, Pool: d.Pool, Device: d.Device, CDIDeviceIDs: slices.Clone(d.CDIDeviceIDs)})
				}
			}
		}
	}
	for _, obj := range fresh {
		if len(errs[string(obj.UID)]) > 0 {
			failed = append(failed, obj)
			continue
		}
		prepared = append(prepared, *recs[string(obj.UID)])
	}
	return prepared, failed, errors.Join(callErrs...)
}

// abandon undoes pod's reservations of the claims whose prepare failed.
// A driver may hold such a claim prepared all the same: this call's
// NodePrepareResources may have succeeded for it with the answer lost, or
// an earlier call's did just before a crash (its claim then comes back
// allocated and reserved, with nothing recorded). So each claim is
// unprepared first (a no-op for a driver that never prepared it) and its
// reservation removed only after that succeeded; when the driver cannot
// be reached, the unprepare and the removal are recorded as owed and
// retried in the background, as a release's are, so the claim keeps its
// devices until the driver has let go of them.
func (m *Manager) abandon(ctx context.Context, pod PodRef, objs []*resourcev1.ResourceClaim, podOf func(claim string) store.ClaimPod) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unreserveTimeout)
	defer cancel()
	for _, obj := range objs {
		ref := ClaimRef{Namespace: obj.Namespace, Name: obj.Name, UID: string(obj.UID)}
		drivers := claimDrivers(obj)
		err := m.unprepareNow(ctx, ref, drivers)
		if err == nil {
			if err := m.cfg.Reserver.Unreserve(ctx, pod, ref); err != nil {
				m.log.WarnContext(ctx, "reservation of a claim that failed to prepare not removed", "claim", key(ref.Namespace, ref.Name), "pod_uid", pod.UID, "error", err)
			}
			continue
		}
		rec := store.Claim{UID: ref.UID, Namespace: ref.Namespace, Name: ref.Name, State: store.ClaimUnpreparing,
			Drivers: drivers, Devices: []store.ClaimDevice{}, Released: []store.ClaimPod{podOf(obj.Name)}}
		if m.cfg.AllocatedHere != nil {
			rec.AllocatedHere = m.cfg.AllocatedHere(obj)
		}
		if cerr := m.commit([]store.Claim{rec}, nil); cerr != nil {
			// Nothing recorded: the reservation stays (and so do the
			// devices) until the pod is prepared and released again.
			m.log.WarnContext(ctx, "claim that failed to prepare left reserved", "claim", key(ref.Namespace, ref.Name), "pod_uid", pod.UID, "error", errors.Join(err, cerr))
			continue
		}
		m.log.WarnContext(ctx, "claim that failed to prepare could not be unprepared; retrying", "claim", key(ref.Namespace, ref.Name), "uid", ref.UID, "error", err)
		m.kick(rec.UID)
	}
}

// unprepareNow calls NodeUnprepareResources for claim on each of drivers.
func (m *Manager) unprepareNow(ctx context.Context, ref ClaimRef, drivers []string) error {
	for _, driver := range drivers {
		res, err := m.cfg.Drivers.Unprepare(ctx, driver, []ClaimRef{ref})
		if err == nil {
			err = res[ref.UID]
		}
		if err != nil {
			m.metrics.unprepares.WithLabelValues(driver, "failed").Inc()
			return fmt.Errorf("unprepare ResourceClaim %s/%s: driver %s: %w", ref.Namespace, ref.Name, driver, err)
		}
		m.metrics.unprepares.WithLabelValues(driver, "ok").Inc()
	}
	return nil
}

// claimDrivers are the drivers of a claim's allocated devices, sorted.
func claimDrivers(obj *resourcev1.ResourceClaim) []string {
	var out []string
	if obj.Status.Allocation != nil {
		for _, r := range obj.Status.Allocation.Devices.Results {
			out = append(out, r.Driver)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// answer is, per container of req, the devices of the claims and requests
// it references, and their CDI device IDs (each once, in order).
func answer(req *PrepareRequest, recs map[string]store.Claim) []ContainerResult {
	claimOf := make(map[string]string, len(req.PodClaims))
	for _, pc := range req.PodClaims {
		claimOf[pc.Name] = pc.ResourceClaimName
	}
	out := make([]ContainerResult, 0, len(req.Containers))
	for _, c := range req.Containers {
		res := ContainerResult{Container: c.Container, CDIDeviceIDs: []string{}, Devices: []ClaimDevice{}}
		for _, cc := range c.Claims {
			rec := recs[claimOf[cc.Name]]
			ref := ClaimRef{Namespace: rec.Namespace, Name: rec.Name, UID: rec.UID}
			for _, d := range devicesOf(rec.Devices) {
				if cc.Request != "" && !servesRequest(d.Requests, cc.Request) {
					continue
				}
				res.Devices = append(res.Devices, ClaimDevice{Claim: ref, Device: d})
				for _, id := range d.CDIDeviceIDs {
					if !slices.Contains(res.CDIDeviceIDs, id) {
						res.CDIDeviceIDs = append(res.CDIDeviceIDs, id)
					}
				}
			}
		}
		out = append(out, res)
	}
	return out
}

// usesOf maps each ResourceClaim name of req to its containers'
// references.
func usesOf(req *PrepareRequest) map[string][]store.ClaimUse {
	claimOf := make(map[string]string, len(req.PodClaims))
	for _, pc := range req.PodClaims {
		claimOf[pc.Name] = pc.ResourceClaimName
	}
	out := map[string][]store.ClaimUse{}
	for _, c := range req.Containers {
		for _, cc := range c.Claims {
			n := claimOf[cc.Name]
			out[n] = append(out[n], store.ClaimUse{Container: c.Container, Request: cc.Request})
		}
	}
	return out
}

// servesRequest: a device serves request when its requests name it or one
// of its subrequests ("<request>/<subrequest>").
func servesRequest(requests []string, request string) bool {
	return slices.ContainsFunc(requests, func(r string) bool { return r == request || strings.HasPrefix(r, request+"/") })
}

func hasPod(pods []store.ClaimPod, uid string) bool {
	return slices.ContainsFunc(pods, func(p store.ClaimPod) bool { return p.UID == uid })
}
