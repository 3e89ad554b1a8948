package server

import (
	"errors"
	"os"
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
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// TestOneEndpointOneResource: an endpoint live under one resource cannot
// serve another, under its own path or another path to the same socket:
// RegisterPlugin gets ALREADY_EXISTS, a legacy Register the kubelet's plain
// error (code Unknown). Nothing changes for the incumbent, no device is
// counted twice, and the reconciler's re-registration of the same
// resource, endpoint and generation stays a no-op. Once the endpoint is no
// longer live, its path may serve another resource.
func TestOneEndpointOneResource(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/first", Devices: 2}, false)
	e.mustRegister(p)
	e.waitCounts("example.com/first", 2, 2)
	legacy := e.plugin("legacy", sampleplugin.Options{Resource: "example.com/legacy", Devices: 1}, true)
	if err := legacy.Register(ctxT(t), e.kubeletSock()); err != nil {
		t.Fatal(err)
	}
	e.waitCounts("example.com/legacy", 1, 1)
	alias := filepath.Join(e.regDir, "alias.sock")
	if err := os.Symlink(p.SocketPath(), alias); err != nil {
		t.Fatal(err)
	}

	gen := testutil.Generation(t, p.SocketPath())
	for _, tc := range []struct{ name, endpoint, generation string }{
		{"same path", p.SocketPath(), gen},
		{"same path, another generation", p.SocketPath(), "other"},
		{"a symlink to it", alias, gen},
		{"a legacy endpoint", legacy.SocketPath(), ""},
	} {
		t.Run("RegisterPlugin "+tc.name, func(t *testing.T) {
			_, err := e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
				ResourceName: "example.com/second", Endpoint: tc.endpoint, Versions: []string{pluginapi.Version}, SocketPath: tc.endpoint, Generation: tc.generation,
			})
			if status.Code(err) != codes.AlreadyExists || !errors.Is(errdefs.FromGRPC(err), errdefs.ErrAlreadyExists) ||
				!strings.Contains(err.Error(), "one endpoint serves one resource") {
				t.Fatalf("%v; want ALREADY_EXISTS", err)
			}
		})
	}

	conn, err := rpcutil.DialPeer(e.kubeletSock())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctxT(t), &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: filepath.Base(legacy.SocketPath()), ResourceName: "example.com/second",
	})
	if status.Code(err) != codes.Unknown || !strings.HasPrefix(status.Convert(err).Message(), "device plugin already connected: "+legacy.SocketPath()) {
		t.Fatalf("legacy Register of a live endpoint under another resource: %v; want the kubelet's plain error", err)
	}

	if r := e.resource("example.com/second"); r != nil {
		t.Fatalf("the second resource exists: %v", r)
	}
	for _, pl := range []*sampleplugin.Plugin{p, legacy} {
		if n := pl.CallCount(sampleplugin.MethodGetDevicePluginOptions); n != 1 {
			t.Errorf("%s was dialled %d times, want once", pl.Resource(), n)
		}
	}
	r := e.waitCounts("example.com/first", 2, 2)
	if len(r.GetEndpoints()) != 1 || r.GetEndpoints()[0].GetState() != dmv1.EndpointState_ENDPOINT_STATE_LIVE {
		t.Fatalf("the incumbent changed: %v", r)
	}

	// The reconciler registering again after its restart: a no-op.
	e.mustRegister(p)
	if n := p.CallCount(sampleplugin.MethodListAndWatch); n != 1 {
		t.Fatalf("re-registration opened another stream (%d)", n)
	}

	// No longer live: the path may serve another resource.
	p.Stop()
	e.waitResource("example.com/first", "its endpoint stopped", func(r *dmv1.Resource) bool {
		return r != nil && r.GetEndpoints()[0].GetState() == dmv1.EndpointState_ENDPOINT_STATE_STOPPED
	})
	next, err := sampleplugin.New(sampleplugin.Options{Resource: "example.com/second", Devices: 3, SocketPath: p.SocketPath(), Log: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := next.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(next.Stop)
	e.mustRegister(next)
	e.waitCounts("example.com/second", 3, 3)
}
