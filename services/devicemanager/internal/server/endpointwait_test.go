package server

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/stream"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
)

// lateStart is how long after its registration a late plugin creates its
// endpoint: the delay of the scenario (a plugin that serves its
// registration socket first), not a synchronisation.
const lateStart = 2 * time.Second

// newLatePlugin returns a device plugin whose endpoint will be at path; it
// is not started.
func newLatePlugin(t *testing.T, resource, path string) *sampleplugin.Plugin {
	t.Helper()
	p, err := sampleplugin.New(sampleplugin.Options{Resource: resource, Devices: 2, SocketPath: path, Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return p
}

// TestEndpointAppearsAfterRegistration: an endpoint file that does not
// exist yet when the registration arrives is waited for, as the kubelet's
// dial waits (up to 10 s), by both registration paths; the wait holds up
// no other registration.
func TestEndpointAppearsAfterRegistration(t *testing.T) {
	e := newEnvConfig(t, time.Minute, stream.Limits{}, manager.EndpointWait)
	kc := pluginapi.NewRegistrationClient(mustDial(t, e.kubeletSock()))
	for _, how := range []string{"RegisterPlugin", "legacy"} {
		t.Run(how, func(t *testing.T) {
			res := "example.com/late-" + strings.ToLower(how)
			dir := e.regDir
			if how == "legacy" {
				dir = e.dpDir
			}
			ep := filepath.Join(dir, "late-"+strings.ToLower(how)+".sock")
			late := newLatePlugin(t, res, ep)
			done := make(chan error, 1)
			go func() {
				var err error
				if how == "legacy" {
					_, err = kc.Register(ctxT(t), &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: filepath.Base(ep), ResourceName: res})
				} else {
					_, err = e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
						ResourceName: res, Endpoint: ep, Versions: []string{pluginapi.Version},
						SocketPath: filepath.Join(e.regDir, "late-reg.sock"), Generation: "g1",
					})
				}
				done <- err
			}()
			testutil.WaitFor(t, "the registration waiting for its endpoint", func() bool {
				return e.logs.has("device plugin endpoint does not exist yet; waiting for it", "endpoint", ep)
			})

			// Another plugin registers while this one waits.
			other := e.plugin("other-"+strings.ToLower(how), sampleplugin.Options{Resource: "example.com/other-" + strings.ToLower(how), Devices: 1}, false)
			e.mustRegister(other)
			e.waitCounts(other.Resource(), 1, 1)
			select {
			case err := <-done:
				t.Fatalf("the registration ended before its endpoint existed: %v", err)
			default:
			}

			<-time.After(lateStart)
			if err := late.Start(); err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("registration of an endpoint that appeared %v later: %v", lateStart, err)
			}
			e.waitCounts(res, 2, 2)
		})
	}
}

// TestEndpointNeverAppears: an endpoint that does not appear within the
// wait fails the registration, with the kubelet's words toward a legacy
// plugin; a registration whose caller gives up stops waiting.
func TestEndpointNeverAppears(t *testing.T) {
	e := newEnv(t, time.Minute) // waits testEndpointWait
	ep := filepath.Join(e.regDir, "never.sock")
	_, err := e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
		ResourceName: "example.com/never", Endpoint: ep, Versions: []string{pluginapi.Version}, SocketPath: ep, Generation: "g1",
	})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "did not appear") {
		t.Fatalf("RegisterPlugin of a missing endpoint: %v; want Unavailable", err)
	}
	kc := pluginapi.NewRegistrationClient(mustDial(t, e.kubeletSock()))
	_, err = kc.Register(ctxT(t), &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "never.sock", ResourceName: "example.com/never"})
	if status.Code(err) != codes.Unknown || status.Convert(err).Message() != "failed to dial device plugin: context deadline exceeded" {
		t.Fatalf("legacy Register of a missing endpoint: %v; want the kubelet's plain error", err)
	}

	// A caller that gives up ends the wait, long before the kubelet's 10 s.
	slow := newEnvConfig(t, time.Minute, stream.Limits{}, time.Hour)
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	ep = filepath.Join(slow.regDir, "never.sock")
	go func() {
		_, err := slow.client.RegisterPlugin(ctx, &dmv1.RegisterPluginRequest{
			ResourceName: "example.com/never", Endpoint: ep, Versions: []string{pluginapi.Version}, SocketPath: ep, Generation: "g1",
		})
		done <- err
	}()
	testutil.WaitFor(t, "the registration waiting for its endpoint", func() bool {
		return slow.logs.has("device plugin endpoint does not exist yet; waiting for it")
	})
	cancel()
	if err := <-done; status.Code(err) != codes.Canceled && !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled registration: %v", err)
	}
	if r := slow.resource("example.com/never"); r != nil {
		t.Fatalf("a registration that never connected left a resource: %v", r)
	}
}
