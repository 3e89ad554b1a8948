package claims_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/services/dramanager/internal/claims"
)

const nicDriver = "nic.example.com"

// startNIC adds the driver nicDriver with p's logic to e, with a pool of
// two devices and the DeviceClass "nic".
func startNIC(t *testing.T, e *env) *plugin {
	t.Helper()
	p := newPlugin(nicDriver)
	e.addDriver(p, "nic", 2)
	return p
}

func withCDIIDs(ids ...string) func([]kubeletplugin.Device) []kubeletplugin.Device {
	return func(d []kubeletplugin.Device) []kubeletplugin.Device { d[0].CDIDeviceIDs = ids; return d }
}

// A driver's answer is checked before the claim is recorded prepared:
// CDI IDs that are not qualified CDI names, devices or pools the
// allocation does not give the driver, requests the claim does not have,
// and more IDs or longer ones than the bounds fail the prepare, naming
// the driver and quoting the field; the claim is rolled back as for a
// driver's error (unprepared, its reservation and allocation removed) and
// nothing of it is recorded. An answer naming the request only, or no
// request, is valid.
func TestDriverAnswersChecked(t *testing.T) {
	e := newEnv(t)
	l := startNIC(t, e)
	many := make([]string, 33)
	for i := range many {
		many[i] = fmt.Sprintf("example.com/nic=id-%d", i)
	}
	for _, tc := range []struct {
		claim string
		twist func([]kubeletplugin.Device) []kubeletplugin.Device
		want  string // in the error; "" for a valid answer
	}{
		{"traversal", withCDIIDs("../../../etc/passwd"), `devices[0].cdiDeviceIDs[0] "../../../etc/passwd": not a qualified CDI device name`},
		{"empty", withCDIIDs("example.com/nic=nic-0", ""), `devices[0].cdiDeviceIDs[1] "": not a qualified CDI device name`},
		{"html", withCDIIDs("<html><body>502 Bad Gateway</body></html>"), `devices[0].cdiDeviceIDs[0] "<html><body>502 Bad Gateway</body></html>": not a qualified CDI device name`},
		{"too-long", withCDIIDs("example.com/nic=" + strings.Repeat("a", 600)), "bytes, more than 571"},
		{"too-many", withCDIIDs(many...), "devices[0]: 33 CDI device IDs, more than 32"},
		{"other-device", func(d []kubeletplugin.Device) []kubeletplugin.Device {
			d[0].DeviceName = "gpu-0"
			return d
		}, `devices[0]: pool "node-1", device "gpu-0", which its allocation does not give the driver`},
		{"other-pool", func(d []kubeletplugin.Device) []kubeletplugin.Device {
			d[0].PoolName = "elsewhere"
			return d
		}, `pool "elsewhere"`},
		{"twice", func(d []kubeletplugin.Device) []kubeletplugin.Device { return append(d, d[0]) }, "2 devices, but its allocation gives the driver 1"},
		{"no-such-request", func(d []kubeletplugin.Device) []kubeletplugin.Device {
			d[0].Requests = []string{"nic", "gpu"}
			return d
		}, `devices[0].requestNames[1] "gpu", not a request the allocation gives this device for (nic)`},
		{"no-request", func(d []kubeletplugin.Device) []kubeletplugin.Device { d[0].Requests = nil; return d }, ""},
		{"no-device", func([]kubeletplugin.Device) []kubeletplugin.Device { return nil }, ""},
	} {
		t.Run(tc.claim, func(t *testing.T) {
			l.set(func(p *plugin) { p.twist[tc.claim] = tc.twist })
			e.claimOf(t, "nic", tc.claim, "nic")
			_, err := e.mgr.Prepare(ctx, podReq("p-"+tc.claim, tc.claim))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("a valid answer: %v", err)
				}
				e.release("p-"+tc.claim, 1)
				e.waitGone(tc.claim)
				return
			}
			checkRefused(t, e, l, tc.claim, err, tc.want)
		})
	}
}

// checkRefused checks that err fails the prepare of claim for the
// driver's answer and that the claim was rolled back.
func checkRefused(t *testing.T, e *env, l *plugin, claim string, err error, want string) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "DRA driver "+nicDriver+" answered NodePrepareResources for ResourceClaim "+ns+"/"+claim) ||
		!strings.Contains(err.Error(), want) {
		t.Fatalf("prepare: %v\nwant the driver named and %q", err, want)
	}
	if l := e.mgr.List(); slices.ContainsFunc(l, func(c claims.Claim) bool { return c.Ref.Name == claim && c.State == claims.StatePrepared }) {
		t.Fatalf("the claim is recorded prepared: %+v", l)
	}
	e.waitGone(claim)
	testutil.Eventually(t, claim+" unprepared, unreserved and deallocated", func() error {
		c := e.get(claim)
		if _, n := l.counts(claim); n != 1 || c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 {
			return fmt.Errorf("unprepared %d times, status %+v", n, c.Status)
		}
		return nil
	})
}

// A driver that is down fails the prepare as unavailable, and the reason
// that blames the driver, with its name and socket, survives to the
// status the dramanager answers.
func TestDriverDownIsTheDriversFault(t *testing.T) {
	e := newEnv(t)
	e.claim("one", "gpu")
	e.driver.Helper.Stop()
	_, err := e.mgr.Prepare(ctx, podReq("p1", "one"))
	info, ok := errdefs.InfoOf(errdefs.ToGRPC(err))
	if !errors.Is(err, errdefs.ErrUnavailable) || !ok || info.GetReason() != errdefs.ReasonDRADriverUnreachable ||
		info.GetMetadata()[errdefs.MetaDriver] != driverName || info.GetMetadata()[errdefs.MetaSocket] != e.driver.Endpoint {
		t.Fatalf("prepare with the driver down: %v (ErrorInfo %v), want unavailable, reason %s naming %s at %s",
			err, info, errdefs.ReasonDRADriverUnreachable, driverName, e.driver.Endpoint)
	}
	if !strings.Contains(err.Error(), "DRA driver "+driverName+" (socket \""+e.driver.Endpoint+"\"): NodePrepareResources: ") {
		t.Errorf("message %q does not name the driver and its socket", err)
	}
}
