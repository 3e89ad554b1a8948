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
	"github.com/nodeplug/nodeplug/services/internal/store"
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
// and the records are durable before Prepare returns. Before a claim is
// reserved, the intent to is recorded (intents.go), so that a kill before
// the records are durable leaves what to roll back.
//
// A failure fails the whole call and is retryable. What did succeed stays
// recorded with the pod (the claims prepared by the same driver call, the
// recorded claims the pod was added to), so the retry calls no driver for
// them and releasing the pod unprepares them; the claims that failed are
// unprepared and their reservation for the pod is removed (which
// deallocates a claim this node allocated for it alone) — or, when their
// driver cannot be reached for that, recorded as unpreparing until it can
// (see undo). A claim whose unprepare is owed is unprepared first, and
// fails the call only when that fails. A driver's error for a claim is
// errdefs.ErrUnavailable with the driver's message.
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
	recs, need, uids, err := m.sortOut(ctx, req.Pod, names)
	if err != nil {
		return nil, false, err
	}
	if len(need) == 0 {
		return answer(&req, recs), false, nil
	}
	keys, err := m.intend(req.Pod, need, uids)
	if err != nil {
		return nil, false, err
	}
	fresh, put, err := m.reserve(ctx, req.Pod, need, recs, podOf)
	var prepared []store.Claim
	if err == nil && len(fresh) > 0 {
		if err = m.intendCalls(req.Pod, fresh); err == nil {
			Crash(CrashCalling)
			prepared, _, err = m.callDrivers(ctx, fresh, podOf)
			Crash(CrashPrepared)
		}
	}
	for _, c := range prepared {
		recs[c.Name] = c
	}
	put = append(put, prepared...)
	done := make([]string, 0, len(put))
	for _, c := range put {
		done = append(done, store.IntentKey(req.Pod.UID, c.Namespace, c.Name))
	}
	// What succeeded is recorded with the pod, and its intent goes, even
	// when the call fails: the retry calls no driver for it.
	if cerr := m.commit(put, done); cerr != nil {
		err = errors.Join(err, cerr)
	} else if err == nil {
		Crash(CrashCommitted)
	}
	if err != nil {
		m.abandon(ctx, keys)
		return nil, len(fresh) > 0, err
	}
	return answer(&req, recs), len(fresh) > 0, nil
}

// sortOut sorts the claims of names out: those recorded with pod (recs),
// and those to reserve for it (need), with the UIDs of those recorded for
// other pods. What a claim owes blocks no prepare: a rollback owed for
// this pod and claim (its intent), or the unprepare of a claim whose
// last pod went, is done now, and the claim then reserved afresh.
func (m *Manager) sortOut(ctx context.Context, pod PodRef, names []string) (recs map[string]store.Claim, need []string, uids map[string]string, err error) {
	recs, uids = make(map[string]store.Claim, len(names)), map[string]string{}
	for _, n := range names {
		if k := store.IntentKey(pod.UID, pod.Namespace, n); m.hasIntent(k) {
			if err := m.owed(ctx, k); err != nil {
				return nil, nil, nil, fmt.Errorf("ResourceClaim %s/%s: the rollback of an earlier prepare for pod %s, done now: %w", pod.Namespace, n, pod.UID, err)
			}
		}
		rec, _, ok := m.lookup(pod.Namespace, n)
		if ok && rec.State == store.ClaimUnpreparing {
			if err := m.owed(ctx, rec.UID); err != nil {
				return nil, nil, nil, fmt.Errorf("ResourceClaim %s/%s is being unprepared (UID %s); its unprepare, done now: %w", pod.Namespace, n, rec.UID, err)
			}
			if rec, _, ok = m.lookup(pod.Namespace, n); ok && rec.State == store.ClaimUnpreparing {
				return nil, nil, nil, fmt.Errorf("ResourceClaim %s/%s (UID %s) is still being unprepared: %w", pod.Namespace, n, rec.UID, errdefs.ErrUnavailable)
			}
		}
		switch {
		case ok && hasPod(rec.Pods, pod.UID):
			recs[n] = rec
			continue
		case ok:
			uids[n] = rec.UID
		}
		need = append(need, n)
	}
	return recs, need, uids, nil
}

// reserve reserves the claims of need for pod: a claim recorded for other
// pods is recorded with this one too (put, recs); the others are fresh, to
// be prepared.
func (m *Manager) reserve(ctx context.Context, pod PodRef, need []string, recs map[string]store.Claim, podOf func(claim string) store.ClaimPod) (fresh []*resourcev1.ResourceClaim, put []store.Claim, err error) {
	for _, n := range need {
		rec, _, ok := m.lookup(pod.Namespace, n)
		ref := ClaimRef{Namespace: pod.Namespace, Name: n, UID: rec.UID}
		obj, err := m.cfg.Reserver.Reserve(ctx, pod, ref)
		if err != nil {
			return fresh, put, fmt.Errorf("reserve ResourceClaim %s/%s: %w", ref.Namespace, ref.Name, err)
		}
		Crash(CrashReserved)
		if !ok {
			fresh = append(fresh, obj)
			continue
		}
		if string(obj.UID) != rec.UID {
			return fresh, put, fmt.Errorf("ResourceClaim %s/%s has UID %s, but the one prepared here (UID %s) is still in use: %w",
				ref.Namespace, ref.Name, obj.UID, rec.UID, errdefs.ErrFailedPrecondition)
		}
		rec.Pods = append(rec.Pods, podOf(n))
		rec.Released = slices.DeleteFunc(rec.Released, func(p store.ClaimPod) bool { return p.UID == pod.UID })
		recs[n] = rec
		put = append(put, rec)
	}
	return fresh, put, nil
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
			r, ok := checkAnswer(driver, fresh, ref, res)
			switch {
			case cerr != nil:
				errs[ref.UID] = append(errs[ref.UID], cerr.Error())
				callErrs = append(callErrs, fmt.Errorf("prepare ResourceClaim %s/%s: driver %s: %w", ref.Namespace, ref.Name, driver, cerr))
			case !ok:
				errs[ref.UID] = append(errs[ref.UID], "no result")
				callErrs = append(callErrs, fmt.Errorf("prepare ResourceClaim %s/%s: driver %s answered nothing for it: %w", ref.Namespace, ref.Name, driver, errdefs.ErrUnavailable))
			case r.Err != nil:
				errs[ref.UID] = append(errs[ref.UID], r.Err.Error())
				// The driver's own refusal, or an answer it should not have
				// given: the driver's fault, said as such to the caller.
				callErrs = append(callErrs, errdefs.WithReason(
					fmt.Errorf("prepare ResourceClaim %s/%s: driver %s: %v: %w", ref.Namespace, ref.Name, driver, r.Err, errdefs.ErrUnavailable),
					errdefs.ReasonDRADriverFailed, map[string]string{errdefs.MetaDriver: driver, errdefs.MetaCall: "NodePrepareResources"}))
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

// unprepareNow calls NodeUnprepareResources for claim on each of drivers.
func (m *Manager) unprepareNow(ctx context.Context, ref ClaimRef, drivers []string) error {
	for _, driver := range drivers {
		res, err := m.cfg.Drivers.Unprepare(ctx, driver, []ClaimRef{ref})
		if err == nil && res[ref.UID] != nil {
			err = fmt.Errorf("%v: %w", res[ref.UID], errdefs.ErrUnavailable)
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
			addDevices(&res, ClaimRef{Namespace: rec.Namespace, Name: rec.Name, UID: rec.UID}, devicesOf(rec.Devices), cc.Request)
		}
		out = append(out, res)
	}
	return out
}

// addDevices adds to res the devices of the claim ref that serve request
// (all of them for ""), and their CDI device IDs it does not hold yet.
func addDevices(res *ContainerResult, ref ClaimRef, devs []Device, request string) {
	for _, d := range devs {
		if request != "" && !servesRequest(d.Requests, request) {
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
