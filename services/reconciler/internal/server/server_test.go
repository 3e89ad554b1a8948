package server

import (
	"testing"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	reconcilerv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/reconciler/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/status"
)

// checkPlugin marshals PluginToProto(p) as ListPlugins and WatchPlugins
// send it and checks that the socket path comes back unchanged and every
// other string is UTF-8.
func checkPlugin(t *testing.T, p status.PluginStatus) {
	t.Helper()
	msg := &reconcilerv1.ListPluginsResponse{InstanceId: "i", Plugins: []*reconcilerv1.Plugin{PluginToProto(p)}}
	b, err := proto.Marshal(msg)
	if err != nil {
		t.Fatalf("ListPlugins with %+v does not marshal: %v", p, err)
	}
	var out reconcilerv1.ListPluginsResponse
	if err := proto.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	got := out.GetPlugins()[0]
	if path, err := bounds.PathFromWire(got.GetSocketPath(), got.GetSocketPathBytes()); err != nil || path != p.SocketPath {
		t.Fatalf("socket path %q came back as %q, %v", p.SocketPath, path, err)
	}
	if endpoint, err := bounds.PathFromText(got.GetEndpoint()); err != nil || endpoint != p.Endpoint {
		t.Fatalf("endpoint %q came back as %q, %v", p.Endpoint, endpoint, err)
	}
	if utf8.ValidString(p.LastError) && got.GetLastError() != p.LastError {
		t.Fatalf("last error %q came back as %q", p.LastError, got.GetLastError())
	}
}

// TestPluginToProtoNotUTF8: a plugin entry whose socket path, endpoint,
// error and names hold bytes that are not UTF-8 still marshals, so one odd
// file name does not fail ListPlugins or WatchPlugins for every plugin.
func TestPluginToProtoNotUTF8(t *testing.T) {
	odd := "/r/plugins_registry/bad\xff\xfe.sock"
	for _, p := range []status.PluginStatus{
		{SocketPath: "/r/plugins_registry/a.sock", Name: "example.com/a", Endpoint: "/r/device-plugins/a.sock", State: status.StateRegistered},
		{SocketPath: odd, Endpoint: odd, State: status.StateFailed,
			LastError: "RegisterPlugin error -- dial failed at socket " + odd, Versions: []string{"v1", "v\xff"}, Name: "n\xfe", Type: "t\xc3"},
	} {
		checkPlugin(t, p)
	}
}

// FuzzPluginToProto: any bytes in an entry's strings give a message that
// marshals, with the socket path and endpoint carried losslessly.
func FuzzPluginToProto(f *testing.F) {
	f.Add("/r/plugins_registry/a.sock", "example.com/a", "")
	f.Add("/r/plugins_registry/bad\xff\xfe.sock", "n\xfe", "dial /r/plugins_registry/bad\xff\xfe.sock")
	f.Add(`"/x"`, "", "\xc3")
	f.Fuzz(func(t *testing.T, path, name, lastError string) {
		checkPlugin(t, status.PluginStatus{SocketPath: path, Endpoint: path, Name: name, Type: name, Versions: []string{name},
			Generation: name, LastError: lastError, State: status.StateFailed})
	})
}
