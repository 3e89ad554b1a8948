package server

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/kubeletrules"
)

// kubeletMessage returns the kubelet's message a RegisterPlugin error
// carries, "" when it carries none.
func kubeletMessage(err error) string {
	for _, d := range status.Convert(err).Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == kubeletrules.ErrorInfoDomain && info.GetReason() == kubeletrules.ErrorInfoReason {
			return info.GetMetadata()[kubeletrules.ErrorInfoKey]
		}
	}
	return ""
}

// TestRegisterPluginKubeletMessage: a RegisterPlugin failure keeps
// nodeplug's code and message, and carries the kubelet's words for it, for
// the reconciler to tell the plugin (NotifyRegistrationStatus).
func TestRegisterPluginKubeletMessage(t *testing.T) {
	e := newEnv(t, time.Minute)
	failing := e.plugin("failing", sampleplugin.Options{Resource: "example.com/failing", Devices: 1}, false)
	failing.SetFailure(sampleplugin.MethodGetDevicePluginOptions, status.Error(codes.Internal, "not ready"))
	live := e.plugin("live", sampleplugin.Options{Resource: "example.com/live", Devices: 1}, false)
	e.mustRegister(live)
	missing := filepath.Join(e.regDir, "missing.sock")
	for _, tc := range []struct {
		name    string
		req     *dmv1.RegisterPluginRequest
		code    codes.Code
		kubelet string
	}{
		{"options fail", &dmv1.RegisterPluginRequest{ResourceName: "example.com/failing", Endpoint: failing.SocketPath(),
			Versions: []string{pluginapi.Version}, SocketPath: failing.SocketPath(), Generation: "g"},
			codes.Internal, "failed to get device plugin options: rpc error: code = Internal desc = not ready"},
		{"live under another resource", &dmv1.RegisterPluginRequest{ResourceName: "example.com/other", Endpoint: live.SocketPath(),
			Versions: []string{pluginapi.Version}, SocketPath: live.SocketPath(), Generation: "g"},
			codes.AlreadyExists, "device plugin already connected: " + live.SocketPath()},
		{"endpoint never appears", &dmv1.RegisterPluginRequest{ResourceName: "example.com/missing", Endpoint: missing,
			Versions: []string{pluginapi.Version}, SocketPath: missing, Generation: "g"},
			codes.Unavailable, "failed to dial device plugin: context deadline exceeded"},
		{"versions", &dmv1.RegisterPluginRequest{ResourceName: "example.com/v", Endpoint: live.SocketPath(),
			Versions: []string{"v1alpha"}, SocketPath: live.SocketPath(), Generation: "g"},
			codes.InvalidArgument, "manager version, v1beta1, is not among plugin supported versions [v1alpha]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.client.RegisterPlugin(ctxT(t), tc.req)
			if status.Code(err) != tc.code {
				t.Fatalf("err = %v, want %v", err, tc.code)
			}
			if got := kubeletMessage(err); got != tc.kubelet {
				t.Fatalf("kubelet message = %q, want %q (error %v)", got, tc.kubelet, err)
			}
		})
	}
}

// TestKubeletMessageNotUTF8: a RegisterPlugin failure whose texts echo bytes
// that are not UTF-8 (a plugin's error message, sent by a plugin whose gRPC
// library passes it as it is) keeps its kubelet message detail, the bytes
// replaced: the detail travels as a marshaled google.rpc.Status, which one
// invalid string would fail as a whole.
func TestKubeletMessageNotUTF8(t *testing.T) {
	err := kubeletrules.Status(fmt.Errorf("device plugin example.com/odd: %w",
		kubeletrules.New("failed to get device plugin options: bad\xff\xfe answer", "", errdefs.ErrInternal)))
	if got, want := kubeletMessage(err), "failed to get device plugin options: bad\uFFFD answer"; got != want {
		t.Fatalf("kubelet message = %q, want %q (error %v)", got, want, err)
	}
	st := status.Convert(err)
	if st.Code() != codes.Internal || !utf8.ValidString(st.Message()) {
		t.Fatalf("status %v", st)
	}
	if _, err := proto.Marshal(st.Proto()); err != nil {
		t.Fatalf("the status does not marshal: %v", err)
	}
}
