package claims_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/drivers"
)

var ctx = context.Background()

func (e *env) prepare(r claims.PrepareRequest) []claims.ContainerResult {
	e.t.Helper()
	out, err := e.mgr.Prepare(ctx, r)
	if err != nil {
		e.t.Fatalf("prepare %s: %v", r.Pod.Name, err)
	}
	return out
}

func (e *env) release(pod string, want int) {
	e.t.Helper()
	n, err := e.mgr.ReleasePod(ctx, "uid-"+pod)
	if err != nil || n != want {
		e.t.Fatalf("release %s: %d claims, %v; want %d", pod, n, err, want)
	}
}

// waitGone waits until claim is no longer recorded.
func (e *env) waitGone(claim string) {
	e.t.Helper()
	testutil.Eventually(e.t, claim+" unprepared and gone", func() error {
		for _, c := range e.mgr.List() {
			if c.Ref.Name == claim {
				return fmt.Errorf("still recorded: state %d, last error %q", c.State, c.LastError)
			}
		}
		return nil
	})
}

func reservedFor(e *env, claim string) []string {
	var out []string
	for _, r := range e.get(claim).Status.ReservedFor {
		out = append(out, string(r.UID))
	}
	return out
}

// TestPrepareAndRelease: a claim is allocated, prepared by its driver
// once, its CDI IDs returned for the container; the same call again calls
// no driver; release unprepares it once and undoes the allocation.
func TestPrepareAndRelease(t *testing.T) {
	e := newEnv(t)
	e.claim("one", "gpu")
	out := e.prepare(podReq("p1", "one"))
	if len(out) != 1 || out[0].Container != "main" || len(out[0].CDIDeviceIDs) != 1 || !strings.HasPrefix(out[0].CDIDeviceIDs[0], driverName+"/dev=gpu-") {
		t.Fatalf("answer: %+v", out)
	}
	d := out[0].Devices[0]
	if d.Claim.Name != "one" || d.Claim.UID == "" || d.Driver != driverName || d.Pool != "node-1" || !slices.Equal(d.Requests, []string{"gpu"}) {
		t.Fatalf("device: %+v", d)
	}
	if got := reservedFor(e, "one"); !slices.Equal(got, []string{"uid-p1"}) {
		t.Fatalf("reservedFor: %v", got)
	}
	again := e.prepare(podReq("p1", "one"))
	if fmt.Sprint(again) != fmt.Sprint(out) {
		t.Fatalf("the same call answered\n%+v\nthen\n%+v", out, again)
	}
	if p, u := e.plugin.counts("one"); p != 1 || u != 0 {
		t.Fatalf("driver calls: %d prepares, %d unprepares", p, u)
	}
	l := e.mgr.List()
	if len(l) != 1 || l[0].State != claims.StatePrepared || !slices.Equal(l[0].Pods, []string{"uid-p1"}) || !l[0].AllocatedHere {
		t.Fatalf("list: %+v", l)
	}
	e.release("p1", 1)
	e.waitGone("one")
	if p, u := e.plugin.counts("one"); p != 1 || u != 1 {
		t.Fatalf("driver calls: %d prepares, %d unprepares", p, u)
	}
	c := e.get("one")
	if c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 {
		t.Fatalf("claim after release: %+v", c.Status)
	}
	e.release("p1", 0)
}

// TestContainerRequests: a container naming a request gets only that
// request's devices; one naming the claim gets all.
func TestContainerRequests(t *testing.T) {
	e := newEnv(t)
	e.claim("two", "a", "b")
	r := podReq("p1", "two")
	r.Containers = []claims.ContainerClaims{
		{Container: "all", Claims: []claims.ContainerClaim{{Name: "c0"}}},
		{Container: "only-b", Claims: []claims.ContainerClaim{{Name: "c0", Request: "b"}}},
		{Container: "none"},
	}
	out := e.prepare(r)
	if len(out) != 3 || len(out[0].CDIDeviceIDs) != 2 || len(out[1].CDIDeviceIDs) != 1 || len(out[2].CDIDeviceIDs) != 0 {
		t.Fatalf("answer: %+v", out)
	}
	if !slices.Equal(out[1].Devices[0].Requests, []string{"b"}) || !slices.Contains(out[0].CDIDeviceIDs, out[1].CDIDeviceIDs[0]) {
		t.Fatalf("request b: %+v", out[1])
	}
	// A container's start reads the same from the records.
	for i, name := range []string{"all", "only-b"} {
		got, ok := e.mgr.Container("uid-p1", name)
		if !ok || !slices.Equal(got.CDIDeviceIDs, out[i].CDIDeviceIDs) {
			t.Fatalf("Container(%s) = %+v, %v; prepare answered %+v", name, got, ok, out[i])
		}
	}
	if got, ok := e.mgr.Container("uid-p1", "none"); ok {
		t.Fatalf("a container referencing no claim: %+v", got)
	}
	if _, ok := e.mgr.Container("uid-other", "all"); ok {
		t.Fatal("another pod's container")
	}
}

// TestSharedClaim: a claim two pods use is prepared once and unprepared
// after the second release only.
func TestSharedClaim(t *testing.T) {
	e := newEnv(t)
	e.claim("shared", "gpu")
	a := e.prepare(podReq("p1", "shared"))
	b := e.prepare(podReq("p2", "shared"))
	if !slices.Equal(a[0].CDIDeviceIDs, b[0].CDIDeviceIDs) {
		t.Fatalf("pods got %v and %v", a[0].CDIDeviceIDs, b[0].CDIDeviceIDs)
	}
	if got := reservedFor(e, "shared"); len(got) != 2 {
		t.Fatalf("reservedFor: %v", got)
	}
	e.release("p1", 1)
	testutil.Eventually(t, "p1's reservation removed", func() error {
		if got := reservedFor(e, "shared"); !slices.Equal(got, []string{"uid-p2"}) {
			return fmt.Errorf("reservedFor %v", got)
		}
		return nil
	})
	if p, u := e.plugin.counts("shared"); p != 1 || u != 0 {
		t.Fatalf("after the first release: %d prepares, %d unprepares", p, u)
	}
	e.release("p2", 1)
	e.waitGone("shared")
	if p, u := e.plugin.counts("shared"); p != 1 || u != 1 {
		t.Fatalf("after the second release: %d prepares, %d unprepares", p, u)
	}
}

// TestDriverErrorPreparesNothing: a driver's error for a claim fails the
// pod's prepare with the driver's message, records nothing for it and
// removes the reservation; the retry prepares it. The other claim of the
// same call stays recorded and is not prepared again.
func TestDriverErrorPreparesNothing(t *testing.T) {
	e := newEnv(t)
	e.claim("good", "gpu")
	e.claim("bad", "gpu")
	e.plugin.set(func(p *plugin) { p.failPrepare["bad"] = "device gpu-x is on fire" })
	_, err := e.mgr.Prepare(ctx, podReq("p1", "good", "bad"))
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "device gpu-x is on fire") || !strings.Contains(err.Error(), "ns/bad") {
		t.Fatalf("prepare: %v", err)
	}
	l := e.mgr.List()
	if len(l) != 1 || l[0].Ref.Name != "good" {
		t.Fatalf("recorded: %+v", l)
	}
	if c := e.get("bad"); len(c.Status.ReservedFor) != 0 || c.Status.Allocation != nil {
		t.Fatalf("the failed claim keeps %+v", c.Status)
	}
	e.plugin.set(func(p *plugin) { delete(p.failPrepare, "bad") })
	out := e.prepare(podReq("p1", "good", "bad"))
	if len(out[0].CDIDeviceIDs) != 2 {
		t.Fatalf("retry answered %+v", out)
	}
	if g, _ := e.plugin.counts("good"); g != 1 {
		t.Fatalf("good prepared %d times", g)
	}
	if b, _ := e.plugin.counts("bad"); b != 2 {
		t.Fatalf("bad prepared %d times", b)
	}
}

// TestUnregisteredDriver: a claim whose driver is not registered fails
// Unavailable, naming it. The driver may hold the claim prepared all the
// same (a prepare whose answer a crash lost), so the claim keeps its
// allocation, recorded as unpreparing, until the driver is back and has
// unprepared it; then its reservation goes and nothing is recorded.
func TestUnregisteredDriver(t *testing.T) {
	e := newEnv(t)
	e.claim("one", "gpu")
	if ok, err := e.reg.Deregister(ctx, driverName, e.driver.Endpoint, e.driver.Generation(t)); !ok || err != nil {
		t.Fatalf("deregister: %v, %v", ok, err)
	}
	_, err := e.mgr.Prepare(ctx, podReq("p1", "one"))
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), driverName) {
		t.Fatalf("prepare: %v", err)
	}
	if l := e.mgr.List(); len(l) != 1 || l[0].State != claims.StateUnpreparing || len(l[0].Pods) != 0 {
		t.Fatalf("recorded: %+v, want the claim unpreparing", l)
	}
	if c := e.get("one"); c.Status.Allocation == nil {
		t.Fatalf("the claim lost its allocation while its driver may hold it prepared: %+v", c.Status)
	}
	if _, err := e.reg.Register(ctx, drivers.Registration{Driver: driverName, Endpoint: e.driver.Endpoint, Services: e.driver.Services,
		SocketPath: e.driver.RegSocket, Generation: e.driver.Generation(t) + "-again"}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, "the claim unprepared and released once the driver is back", func() error {
		if l := e.mgr.List(); len(l) != 0 {
			return fmt.Errorf("recorded: %+v", l)
		}
		if c := e.get("one"); len(c.Status.ReservedFor) != 0 || c.Status.Allocation != nil {
			return fmt.Errorf("the claim keeps %+v", c.Status)
		}
		return nil
	})
	if _, n := e.plugin.counts("one"); n != 1 {
		t.Fatalf("unprepared %d times, want once", n)
	}
}

// TestUnprepareRetried: an unprepare that fails is retried until it
// succeeds; meanwhile the claim is listed as unpreparing with the error,
// and a prepare of it, which tries that unprepare at once, fails with
// the driver's error as unavailable.
func TestUnprepareRetried(t *testing.T) {
	e := newEnv(t)
	e.claim("one", "gpu")
	e.prepare(podReq("p1", "one"))
	e.plugin.set(func(p *plugin) { p.unprepareFails = 1 << 30 })
	e.release("p1", 1)
	testutil.Eventually(t, "failing unprepare retried and visible", func() error {
		l := e.mgr.List()
		if _, u := e.plugin.counts("one"); u < 3 || len(l) != 1 || l[0].State != claims.StateUnpreparing || !strings.Contains(l[0].LastError, "busy") {
			return fmt.Errorf("%d unprepares, list %+v", u, l)
		}
		return nil
	})
	if _, err := e.mgr.Prepare(ctx, podReq("p2", "one")); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("prepare while unpreparing: %v", err)
	}
	e.plugin.set(func(p *plugin) { p.unprepareFails = 0 })
	e.waitGone("one")
}

// TestRestart: after a crash (no flush), a restart never prepares again
// what was recorded, and resumes an owed unprepare.
func TestRestart(t *testing.T) {
	e := newEnv(t)
	e.claim("kept", "gpu")
	e.claim("owed", "gpu")
	e.prepare(podReq("p1", "kept"))
	e.prepare(podReq("p2", "owed"))
	e.plugin.set(func(p *plugin) { p.unprepareFails = 1 << 30 })
	e.release("p2", 1)
	testutil.Eventually(t, "an unprepare attempted", func() error {
		if _, u := e.plugin.counts("owed"); u == 0 {
			return errors.New("none yet")
		}
		return nil
	})
	e.crash()
	e.plugin.set(func(p *plugin) { p.unprepareFails = 0 })
	e.start()
	e.waitGone("owed")
	e.prepare(podReq("p1", "kept"))
	if p, _ := e.plugin.counts("kept"); p != 1 {
		t.Fatalf("kept prepared %d times", p)
	}
	if c := e.get("owed"); c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 {
		t.Fatalf("owed after restart: %+v", c.Status)
	}
	e.release("p1", 1)
	e.waitGone("kept")
}

// TestTraceReachesDriver: the prepare's span is the parent the driver
// call carries; the unprepare is a trace of its own.
func TestTraceReachesDriver(t *testing.T) {
	e := newEnv(t)
	e.claim("traced", "gpu")
	start := time.Now()
	uid := e.prepare(podReq("p1", "traced"))[0].Devices[0].Claim.UID
	var id string
	for _, s := range spans.Ended() {
		if s.Name() == "prepare pod ns/p1" && hasAttr(s.Attributes(), "pod.uid", "uid-p1") && s.EndTime().After(start) {
			id = s.SpanContext().TraceID().String()
		}
	}
	e.plugin.mu.Lock()
	tps := slices.Clone(e.plugin.traceparents)
	e.plugin.mu.Unlock()
	if id == "" || len(tps) == 0 || !strings.Contains(tps[len(tps)-1], id) {
		t.Fatalf("trace %q, driver saw %v", id, tps)
	}
	e.release("p1", 1)
	e.waitGone("traced")
	// The claim leaves the list when its removal commits; the span of
	// that attempt ends just after, so wait for it rather than look once.
	testutil.Eventually(t, "one unprepare span of its own trace", func() error {
		var unprepare int
		for _, s := range spans.Ended() {
			if s.Name() == "unprepare claim ns/traced" && hasAttr(s.Attributes(), "claim.uid", uid) &&
				s.SpanContext().TraceID().String() != id && s.Status().Code != codes.Error {
				unprepare++
			}
		}
		if unprepare != 1 {
			return fmt.Errorf("%d successful unprepare spans of their own trace, want 1", unprepare)
		}
		return nil
	})
}

func hasAttr(kvs []attribute.KeyValue, k, v string) bool {
	return slices.ContainsFunc(kvs, func(kv attribute.KeyValue) bool { return string(kv.Key) == k && kv.Value.AsString() == v })
}

// TestInvalidRequest: bad input is InvalidArgument naming the field.
func TestInvalidRequest(t *testing.T) {
	e := newEnv(t)
	for field, r := range map[string]claims.PrepareRequest{
		"pod.uid":                           {Pod: claims.PodRef{Namespace: ns, Name: "p"}},
		"pod_claims is empty":               {Pod: claims.PodRef{UID: "u", Namespace: ns, Name: "p"}},
		"pod_claims[1].name":                {Pod: claims.PodRef{UID: "u", Namespace: ns, Name: "p"}, PodClaims: []claims.PodClaim{{Name: "a", ResourceClaimName: "x"}, {Name: "a", ResourceClaimName: "y"}}},
		"containers[0].claims[0].name":      {Pod: claims.PodRef{UID: "u", Namespace: ns, Name: "p"}, PodClaims: []claims.PodClaim{{Name: "a", ResourceClaimName: "x"}}, Containers: []claims.ContainerClaims{{Container: "c", Claims: []claims.ContainerClaim{{Name: "b"}}}}},
		"pod_claims[0].resource_claim_name": {Pod: claims.PodRef{UID: "u", Namespace: ns, Name: "p"}, PodClaims: []claims.PodClaim{{Name: "a", ResourceClaimName: "Bad_Name"}}},
	} {
		_, err := e.mgr.Prepare(ctx, r)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s: %v", field, err)
		}
	}
}

// TestConcurrentShared: pods preparing and releasing one claim at once
// prepare it once and unprepare it once, after the last release.
func TestConcurrentShared(t *testing.T) {
	e := newEnv(t)
	e.claim("shared", "gpu")
	const pods = 8
	errs := make(chan error, pods)
	for i := range pods {
		go func() {
			_, err := e.mgr.Prepare(ctx, podReq(fmt.Sprintf("p%d", i), "shared"))
			errs <- err
		}()
	}
	for range pods {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if l := e.mgr.List(); len(l) != 1 || len(l[0].Pods) != pods {
		t.Fatalf("list: %+v", l)
	}
	for i := range pods {
		go func() {
			_, err := e.mgr.ReleasePod(ctx, fmt.Sprintf("uid-p%d", i))
			errs <- err
		}()
	}
	for range pods {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	e.waitGone("shared")
	if p, u := e.plugin.counts("shared"); p != 1 || u != 1 {
		t.Fatalf("%d prepares, %d unprepares", p, u)
	}
	if c := e.get("shared"); c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 {
		t.Fatalf("claim after the releases: %+v", c.Status)
	}
}
