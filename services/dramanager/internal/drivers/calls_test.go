package drivers_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/dratest"
)

const gpu = "gpu.example.com"

// A claim allocated in the API is prepared by the driver's helper (which
// reads it from the API) and unprepared; a per-claim failure comes back
// for that claim only; the call carries the caller's trace into the
// driver. Both DRA service versions are covered.
func TestPrepareUnprepare(t *testing.T) {
	for _, tc := range []struct {
		name    string
		opts    []kubeletplugin.Option
		service string
	}{
		{"v1", nil, "v1.DRAPlugin"},
		{"v1beta1", []kubeletplugin.Option{kubeletplugin.NodeV1(false), kubeletplugin.NodeV1beta1(true)}, "v1beta1.DRAPlugin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			api := dratest.StartAPI(t, testutil.TempDir(t))
			r, _ := newRegistry(t, api, 0)
			p := dratest.NewPlugin(gpu)
			d := dratest.StartDriverWith(t, api, gpu, "", p, tc.opts...)
			if in := register(t, r, d); in.Service != tc.service {
				t.Fatalf("service = %q, want %q (offered %q)", in.Service, tc.service, d.Services)
			}
			waitConnected(t, r, d, true)
			ctx := context.Background()
			good, err := dratest.AllocatedClaim(ctx, api.Client, "default", "good", gpu, "dev-0", "dev-1")
			if err != nil {
				t.Fatal(err)
			}
			bad, err := dratest.AllocatedClaim(ctx, api.Client, "default", "bad", gpu, "dev-2")
			if err != nil {
				t.Fatal(err)
			}
			p.Fail("bad", "device dev-2 is on fire")
			refs := []claims.ClaimRef{
				{Namespace: "default", Name: "good", UID: string(good.UID)},
				{Namespace: "default", Name: "bad", UID: string(bad.UID)},
			}
			tctx, span := otel.Tracer("test").Start(ctx, "prepare")
			res, err := r.Prepare(tctx, gpu, refs)
			span.End()
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			g := res[string(good.UID)]
			if g.Err != nil || len(g.Devices) != 2 {
				t.Fatalf("good claim: %+v, want two devices", g)
			}
			for i, dev := range g.Devices {
				want := claims.Device{Requests: []string{[]string{"req-0", "req-1"}[i]}, Driver: gpu, Pool: dratest.Node,
					Device: []string{"dev-0", "dev-1"}[i], CDIDeviceIDs: []string{dratest.CDIID(good.UID, []string{"dev-0", "dev-1"}[i])}}
				if !slices.Equal(dev.Requests, want.Requests) || dev.Driver != want.Driver || dev.Pool != want.Pool ||
					dev.Device != want.Device || !slices.Equal(dev.CDIDeviceIDs, want.CDIDeviceIDs) {
					t.Errorf("device %d = %+v, want %+v", i, dev, want)
				}
			}
			b := res[string(bad.UID)]
			if b.Err == nil || !strings.Contains(b.Err.Error(), "device dev-2 is on fire") || !strings.Contains(b.Err.Error(), "default/bad") {
				t.Errorf("bad claim: %+v, want the driver's error naming the claim", b)
			}
			if tp := p.Traceparents(); len(tp) != 1 || !strings.Contains(tp[0], span.SpanContext().TraceID().String()) {
				t.Errorf("the driver's call carried traceparent %q, want trace %s", tp, span.SpanContext().TraceID())
			}
			if n, _ := p.Calls(good.UID); n != 1 {
				t.Errorf("driver prepared the good claim %d times, want 1", n)
			}
			errs, err := r.Unprepare(ctx, gpu, refs[:1])
			if err != nil || len(errs) != 1 || errs[string(good.UID)] != nil {
				t.Fatalf("Unprepare = %v, %v; want no error for the claim", errs, err)
			}
			if _, n := p.Calls(good.UID); n != 1 {
				t.Errorf("driver unprepared the good claim %d times, want 1", n)
			}
		})
	}
}

// A driver that is not registered is unavailable, named; a claim the
// driver cannot read from the API fails the call as a whole.
func TestPrepareErrors(t *testing.T) {
	api := dratest.StartAPI(t, testutil.TempDir(t))
	r, _ := newRegistry(t, api, 0)
	ctx := context.Background()
	_, err := r.Prepare(ctx, "missing.example.com", []claims.ClaimRef{{Namespace: "default", Name: "c", UID: "u"}})
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "missing.example.com") {
		t.Errorf("Prepare for an unregistered driver: %v, want ErrUnavailable naming it", err)
	}
	if _, err := r.Unprepare(ctx, "missing.example.com", nil); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("Unprepare for an unregistered driver: %v, want ErrUnavailable", err)
	}
	d := dratest.StartDriverWith(t, api, gpu, "", dratest.NewPlugin(gpu))
	register(t, r, d)
	waitConnected(t, r, d, true)
	_, err = r.Prepare(ctx, gpu, []claims.ClaimRef{{Namespace: "default", Name: "nosuch", UID: "u-1"}})
	if err == nil || !strings.Contains(err.Error(), gpu) || !strings.Contains(err.Error(), "NodePrepareResources") {
		t.Errorf("Prepare of a claim not in the API: %v, want the driver's error for the call", err)
	}
}
