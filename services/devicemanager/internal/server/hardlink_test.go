package server

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// TestHardLinkIsTheSameEndpoint (issue 25, N2): a hard link to a live
// endpoint's socket is that endpoint, not a second one. Registered under
// another resource it is refused on both registration paths — the legacy
// Register with the kubelet's plain error (code Unknown, "device plugin
// already connected"), RegisterPlugin with ALREADY_EXISTS — so the
// victim's devices are never handed out twice. Under the victim's own
// resource it is a re-registration of the live endpoint: no second
// endpoint, no second stream.
func TestHardLinkIsTheSameEndpoint(t *testing.T) {
	e := newEnv(t, time.Minute)
	legacy := e.plugin("victim", sampleplugin.Options{Resource: "example.com/victim", Devices: 4}, true)
	if err := legacy.Register(ctxT(t), e.kubeletSock()); err != nil {
		t.Fatal(err)
	}
	e.waitCounts("example.com/victim", 4, 4)
	reg := e.plugin("reg", sampleplugin.Options{Resource: "example.com/reg", Devices: 2}, false)
	e.mustRegister(reg)
	e.waitCounts("example.com/reg", 2, 2)
	link := func(target, name string) string {
		p := filepath.Join(filepath.Dir(target), name)
		if err := os.Link(target, p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	alias := link(legacy.SocketPath(), "alias.sock")
	regAlias := link(reg.SocketPath(), "alias.sock")

	conn, err := rpcutil.DialPeer(e.kubeletSock())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	kc := pluginapi.NewRegistrationClient(conn)
	_, err = kc.Register(ctxT(t), &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "alias.sock", ResourceName: "example.com/alias"})
	if status.Code(err) != codes.Unknown || status.Convert(err).Message() != "device plugin already connected: "+alias {
		t.Fatalf("legacy Register of a hard link under another resource: %v; want the kubelet's plain error", err)
	}
	for _, tc := range []struct{ name, endpoint, generation string }{
		{"a hard link to a legacy endpoint", alias, testutil.Generation(t, alias)},
		{"a hard link to a plugins_registry endpoint", regAlias, testutil.Generation(t, regAlias)},
	} {
		t.Run("RegisterPlugin "+tc.name, func(t *testing.T) {
			_, err := e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
				ResourceName: "example.com/alias", Endpoint: tc.endpoint, Versions: []string{pluginapi.Version}, SocketPath: tc.endpoint, Generation: tc.generation,
			})
			if status.Code(err) != codes.AlreadyExists || !strings.Contains(err.Error(), "one endpoint serves one resource") {
				t.Fatalf("%v; want ALREADY_EXISTS", err)
			}
		})
	}
	if r := e.resource("example.com/alias"); r != nil {
		t.Fatalf("the alias resource exists: %v", r)
	}

	// Under the victim's own resource, by either path: the same endpoint.
	if _, err := kc.Register(ctxT(t), &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: "alias.sock", ResourceName: "example.com/victim"}); err != nil {
		t.Fatalf("legacy Register of a hard link under its own resource: %v", err)
	}
	if _, err := e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
		ResourceName: "example.com/reg", Endpoint: regAlias, Versions: []string{pluginapi.Version}, SocketPath: regAlias, Generation: testutil.Generation(t, regAlias),
	}); err != nil {
		t.Fatalf("RegisterPlugin of a hard link under its own resource: %v", err)
	}
	for _, p := range []*sampleplugin.Plugin{legacy, reg} {
		r := e.waitCounts(p.Resource(), int64(len(p.Devices())), int64(len(p.Devices())))
		if eps := r.GetEndpoints(); len(eps) != 1 || eps[0].GetEndpoint() != p.SocketPath() {
			t.Errorf("%s: endpoints %v, want only %s", p.Resource(), eps, p.SocketPath())
		}
		for _, m := range []string{sampleplugin.MethodGetDevicePluginOptions, sampleplugin.MethodListAndWatch} {
			if n := p.CallCount(m); n != 1 {
				t.Errorf("%s: %d %s calls, want 1", p.Resource(), n, m)
			}
		}
	}

	// Every device of the victim once: 4 allocated, then none is left.
	resp, err := e.client.Allocate(ctxT(t), allocReq("pod", "c", "example.com/victim", 4))
	if err != nil {
		t.Fatal(err)
	}
	if ids := resp.GetAllocations()[0].GetDeviceIds(); !slices.Equal(ids, []string{"dev-0", "dev-1", "dev-2", "dev-3"}) {
		t.Fatalf("allocated %v", ids)
	}
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod2", "c", "example.com/victim", 1)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a fifth device: %v, want FAILED_PRECONDITION", err)
	}
}
