package server

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
)

// rawCodec encodes ListAndWatchResponse by hand, without the UTF-8 check
// of the protobuf library, as a plugin built on another library may send
// it; everything else is ordinary protobuf.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	m, ok := v.(*pluginapi.ListAndWatchResponse)
	if !ok {
		return proto.Marshal(v.(proto.Message))
	}
	var b []byte
	for _, d := range m.GetDevices() {
		var dev []byte
		dev = protowire.AppendTag(dev, 1, protowire.BytesType)
		dev = protowire.AppendString(dev, d.GetID())
		dev = protowire.AppendTag(dev, 2, protowire.BytesType)
		dev = protowire.AppendString(dev, d.GetHealth())
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendBytes(b, dev)
	}
	return b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

var _ encoding.Codec = rawCodec{}

// oddPlugin is a device plugin whose ListAndWatch names a device with bytes
// that are not UTF-8.
type oddPlugin struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (oddPlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (oddPlugin) ListAndWatch(_ *pluginapi.Empty, s grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: []*pluginapi.Device{{ID: "dev\xff\xfe", Health: pluginapi.Healthy}, {ID: "dev-1", Health: pluginapi.Healthy}}}); err != nil {
		return err
	}
	<-s.Context().Done()
	return nil
}

// TestDeviceIDNotUTF8: a device plugin whose ListAndWatch answer holds a
// device ID that is not UTF-8 fails alone, with an error that says so and
// names it; the devicemanager's ListResources and another plugin's devices
// are untouched.
func TestDeviceIDNotUTF8(t *testing.T) {
	e := newEnv(t, time.Minute)
	normal := e.plugin("normal", sampleplugin.Options{Resource: "example.com/normal", Devices: 2}, false)
	e.mustRegister(normal)

	path := filepath.Join(e.regDir, "odd.sock")
	lis, err := unixsock.Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	pluginapi.RegisterDevicePluginServer(srv, oddPlugin{})
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); <-served })

	_, _ = e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
		ResourceName: "example.com/odd", Endpoint: path, Versions: []string{pluginapi.Version},
		SocketPath: path, Generation: testutil.Generation(t, path),
	})
	testutil.Eventually(t, "the odd plugin's stream ended with a clear error", func() error {
		for line := range strings.Lines(e.logs.String()) {
			if strings.Contains(line, "ListAndWatch") && strings.Contains(line, "example.com/odd") && strings.Contains(line, "invalid UTF-8") {
				t.Logf("the devicemanager says: %s", line)
				return nil
			}
		}
		return fmt.Errorf("no log line names example.com/odd and invalid UTF-8")
	})
	if r := e.resource("example.com/odd"); r.GetAllocatable() != 0 {
		t.Errorf("the odd plugin's resource is allocatable: %v", r)
	}
	e.waitCounts("example.com/normal", 2, 2)
	if _, err := e.client.Allocate(ctxT(t), allocReq("pod-1", "c", "example.com/normal", 1)); err != nil {
		t.Fatalf("Allocate of the normal resource: %v", err)
	}
}

// TestRegisterSocketPathNotUTF8: a registration socket path that is not
// UTF-8 comes quoted (bounds.PathText), up to four times as long as the
// path: it is held to the bounds of the path it names, so one of 107 bytes
// registers, and ListResources gives it back as it came.
func TestRegisterSocketPathNotUTF8(t *testing.T) {
	e := newEnv(t, time.Minute)
	p := e.plugin("p", sampleplugin.Options{Resource: "example.com/p", Devices: 1}, false)
	prefix := e.regDir + "/"
	longest := prefix + strings.Repeat("\xff", unixsock.MaxPathLen-len(prefix)-len(".sock")) + ".sock"
	if len(longest) != unixsock.MaxPathLen {
		t.Fatalf("path of %d bytes", len(longest))
	}
	req := func(socketPath string) *dmv1.RegisterPluginRequest {
		return &dmv1.RegisterPluginRequest{ResourceName: p.Resource(), Endpoint: p.SocketPath(), Versions: []string{pluginapi.Version},
			SocketPath: socketPath, Generation: testutil.Generation(t, p.SocketPath())}
	}
	for _, bad := range []string{bounds.PathText(longest + "x"), bounds.PathText(prefix + "nul\x00\xff"), `"` + prefix + `unterminated`} {
		if _, err := e.client.RegisterPlugin(ctxT(t), req(bad)); status.Code(err) != codes.InvalidArgument {
			t.Errorf("RegisterPlugin with socket path %q: %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	if _, err := e.client.RegisterPlugin(ctxT(t), req(bounds.PathText(longest))); err != nil {
		t.Fatalf("RegisterPlugin with the %d-byte socket path %q (%d bytes quoted): %v", len(longest), longest, len(bounds.PathText(longest)), err)
	}
	r := e.waitCounts("example.com/p", 1, 1)
	if eps := r.GetEndpoints(); len(eps) != 1 || eps[0].GetSocketPath() != bounds.PathText(longest) {
		t.Fatalf("endpoints %v, want socket path %s", eps, bounds.PathText(longest))
	}
}
