package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/nodeplug/nodeplug/internal/testutil"
	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/testplugin"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

// TestSocketNamesNotUTF8: registration sockets whose names are not UTF-8,
// as the watcher reports them (quoted, with path_bytes), beside normal
// ones: the reconciler registers them under their real paths (a device
// plugin with its socket path quoted to the devicemanager), refuses alone
// the device plugin whose endpoint is such a name, answers ListPlugins,
// and after a restart keeps the odd device plugin's registration while it
// sweeps a vanished one.
func TestSocketNamesNotUTF8(t *testing.T) {
	e := newEnv(t)
	endpoint := filepath.Join(e.root, "odd-endpoint.sock")
	l, err := net.Listen("unix", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	oddDP := e.plugin("dp\xff\xfe", testplugin.Info{Type: "DevicePlugin", Name: "example.com/odd", Endpoint: endpoint, Versions: []string{"v1beta1"}})
	oddDRA := e.plugin("dra\xfe", draPlugin("odd.example.com"))
	self := e.plugin("self\xc3(", devicePlugin("example.com/self"))
	normal := e.plugin("normal", devicePlugin("example.com/normal"))
	gone := e.plugin("gone", devicePlugin("example.com/zzz"))
	for _, p := range []*testplugin.Plugin{oddDP, oddDRA, self, normal, gone} {
		e.w.Created(t, p.Path())
	}
	for _, p := range []*testplugin.Plugin{oddDP, oddDRA, normal, gone} {
		e.waitRegistered(p.Path())
	}
	st := e.waitState(self.Path(), "refused", func(s status.PluginStatus) bool { return s.State == status.StateFailed })
	if !strings.Contains(st.LastError, "not valid UTF-8") {
		t.Errorf("refusal of %q: %q, want it to say the endpoint is not UTF-8", self.Path(), st.LastError)
	}
	if ep := e.dm.Endpoints()[endpoint]; ep.socketPath != bounds.PathText(oddDP.Path()) {
		t.Errorf("devicemanager got socket path %q, want %q", ep.socketPath, bounds.PathText(oddDP.Path()))
	}

	resp, err := serviceClient(t, e).ListPlugins(waitCtx(t), &reconcilerv1.ListPluginsRequest{})
	if err != nil {
		t.Fatalf("ListPlugins: %v", err)
	}
	listed := map[string]reconcilerv1.PluginState{}
	for _, p := range resp.GetPlugins() {
		path, err := bounds.PathFromWire(p.GetSocketPath(), p.GetSocketPathBytes())
		if err != nil {
			t.Fatal(err)
		}
		listed[path] = p.GetState()
	}
	for p, want := range map[string]reconcilerv1.PluginState{oddDP.Path(): reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED,
		oddDRA.Path(): reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED, normal.Path(): reconcilerv1.PluginState_PLUGIN_STATE_REGISTERED,
		self.Path(): reconcilerv1.PluginState_PLUGIN_STATE_FAILED} {
		if listed[p] != want {
			t.Errorf("ListPlugins: %q is %v, want %v (all: %v)", p, listed[p], want, listed)
		}
	}

	// Restart: the vanished plugin's registration is swept; the odd one,
	// whose socket is still there, stays (the devicemanager lists it
	// quoted, resources in name order: example.com/odd before
	// example.com/zzz).
	e.stop()
	gone.Stop()
	e.w.Deleted(gone.Path())
	e.start()
	e.waitRegistered(oddDP.Path())
	testutil.WaitFor(t, "the vanished plugin's registration swept", func() bool {
		_, ok := e.dm.Endpoints()[gone.Path()]
		return !ok
	})
	for _, call := range e.dm.Calls() {
		if strings.HasPrefix(call, "deregister "+endpoint) {
			t.Fatalf("the odd plugin's registration was swept: %v", e.dm.Calls())
		}
	}
}

// rawInfoCodec encodes PluginInfo by hand, without the UTF-8 check of the
// protobuf library, as a plugin built on another library may send it.
type rawInfoCodec struct{}

func (rawInfoCodec) Name() string { return "proto" }

func (rawInfoCodec) Marshal(v any) ([]byte, error) {
	info, ok := v.(*registerapi.PluginInfo)
	if !ok {
		return proto.Marshal(v.(proto.Message))
	}
	var b []byte
	for i, s := range append([]string{info.GetType(), info.GetName(), info.GetEndpoint()}, info.GetSupportedVersions()...) {
		b = protowire.AppendTag(b, protowire.Number(min(i+1, 4)), protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	return b, nil
}

func (rawInfoCodec) Unmarshal(data []byte, v any) error {
	return proto.Unmarshal(data, v.(proto.Message))
}

// oddInfo answers GetInfo with a name that is not UTF-8.
type oddInfo struct {
	registerapi.UnimplementedRegistrationServer
}

func (oddInfo) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{Type: registerapi.DevicePlugin, Name: "example.com/odd\xff", SupportedVersions: []string{"v1beta1"}}, nil
}

// TestGetInfoAnswerNotUTF8: a plugin whose GetInfo answer is not UTF-8
// fails alone, with an error that says so; a normal plugin registers and
// ListPlugins answers.
func TestGetInfoAnswerNotUTF8(t *testing.T) {
	e := newEnv(t)
	path := e.sock("oddinfo")
	lis, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawInfoCodec{}))
	registerapi.RegisterRegistrationServer(srv, oddInfo{})
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })
	normal := e.plugin("normal", devicePlugin("example.com/normal"))
	e.w.Created(t, path)
	e.w.Created(t, normal.Path())
	e.waitRegistered(normal.Path())
	st := e.waitState(path, "failed", func(s status.PluginStatus) bool { return s.State == status.StateFailed })
	if !strings.Contains(st.LastError, "GetInfo") || !strings.Contains(st.LastError, "invalid UTF-8") {
		t.Errorf("failure of %s: %q, want it to name GetInfo and invalid UTF-8", path, st.LastError)
	}
	if _, err := serviceClient(t, e).ListPlugins(waitCtx(t), &reconcilerv1.ListPluginsRequest{}); err != nil {
		t.Fatalf("ListPlugins: %v", err)
	}
}
