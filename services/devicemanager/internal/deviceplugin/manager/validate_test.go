package manager

import (
	"errors"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// TestValidateRegistration: the bounds of every field, then the kubelet's
// checks and messages, per registration path, as InvalidArgument; no error
// echoes more than bounds.MaxEcho bytes of a value.
func TestValidateRegistration(t *testing.T) {
	v1 := []string{"v1beta1"}
	const ep = "/var/lib/kubelet/device-plugins/gpu.sock"
	huge := strings.Repeat("x", 100<<10)
	tests := []struct {
		name string
		r    Registration
		msg  string // empty: valid
	}{
		{"registry ok", Registration{Resource: "example.com/gpu", Endpoint: ep, Versions: []string{"v1alpha", "v1beta1"}, Path: PathPluginsRegistry}, ""},
		{"legacy ok", Registration{Resource: "vendor.io/a_b.c-d", Endpoint: ep, Versions: v1, Path: PathKubeletSock}, ""},
		{"odd characters in the endpoint", Registration{Resource: "example.com/gpu", Endpoint: "/d/a#b?c%41 d.sock", Versions: v1, Path: PathKubeletSock}, ""},
		{"endpoint of 107 bytes", Registration{Resource: "example.com/gpu", Endpoint: "/" + strings.Repeat("e", 106), Versions: v1, Path: PathKubeletSock}, ""},
		{"registry version", Registration{Resource: "example.com/gpu", Endpoint: ep, Versions: []string{"v1alpha"}, Path: PathPluginsRegistry},
			"manager version, v1beta1, is not among plugin supported versions [v1alpha]"},
		{"legacy version", Registration{Resource: "example.com/gpu", Endpoint: ep, Versions: []string{"v1alpha"}, Path: PathKubeletSock},
			`requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]`},
		{"legacy no version", Registration{Resource: "example.com/gpu", Endpoint: ep, Path: PathKubeletSock},
			`requested API version "" is not supported by kubelet`},
		{"registry name", Registration{Resource: "gpu", Endpoint: ep, Versions: v1, Path: PathPluginsRegistry},
			`invalid name of device plugin socket: the ResourceName "gpu" is invalid`},
		{"empty name", Registration{Endpoint: ep, Versions: v1, Path: PathKubeletSock}, `the ResourceName "" is invalid`},
		{"legacy kubernetes.io", Registration{Resource: "kubernetes.io/gpu", Endpoint: ep, Versions: v1, Path: PathKubeletSock},
			`the ResourceName "kubernetes.io/gpu" is invalid`},
		{"requests. prefix", Registration{Resource: "requests.example.com/gpu", Endpoint: ep, Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"no name after the slash", Registration{Resource: "example.com/", Endpoint: ep, Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"no domain", Registration{Resource: "/gpu", Endpoint: ep, Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"upper case domain", Registration{Resource: "Example.com/gpu", Endpoint: ep, Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"bad name start", Registration{Resource: "example.com/-gpu", Endpoint: ep, Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"name too long", Registration{Resource: "example.com/" + strings.Repeat("a", 64), Endpoint: ep, Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"two slashes", Registration{Resource: "a/b/c", Endpoint: ep, Versions: v1, Path: PathKubeletSock}, "is invalid"},
		// Bounds, before the kubelet's checks.
		{"huge name", Registration{Resource: "example.com/" + huge, Endpoint: ep, Versions: v1, Path: PathPluginsRegistry}, "longer than 253"},
		{"name with NUL", Registration{Resource: "example.com/a\x00b", Endpoint: ep, Versions: v1, Path: PathKubeletSock}, "unprintable"},
		{"name with newline", Registration{Resource: "example.com/a\nb", Endpoint: ep, Versions: v1, Path: PathKubeletSock}, "unprintable"},
		{"no endpoint", Registration{Resource: "example.com/gpu", Versions: v1, Path: PathPluginsRegistry}, "endpoint is empty"},
		{"endpoint of 108 bytes", Registration{Resource: "example.com/gpu", Endpoint: "/" + strings.Repeat("e", 107), Versions: v1, Path: PathPluginsRegistry},
			"longer than the 107 bytes"},
		{"huge endpoint", Registration{Resource: "example.com/gpu", Endpoint: "/" + huge, Versions: v1, Path: PathPluginsRegistry}, "longer than the 107 bytes"},
		{"endpoint with newline", Registration{Resource: "example.com/gpu", Endpoint: "/d/a\nb.sock", Versions: v1, Path: PathPluginsRegistry}, "unprintable"},
		{"huge socket path", Registration{Resource: "example.com/gpu", Endpoint: ep, SocketPath: "/" + huge, Versions: v1, Path: PathPluginsRegistry}, "socket path"},
		{"huge generation", Registration{Resource: "example.com/gpu", Endpoint: ep, Generation: huge, Versions: v1, Path: PathPluginsRegistry}, "generation"},
		{"huge version", Registration{Resource: "example.com/gpu", Endpoint: ep, Versions: []string{huge}, Path: PathKubeletSock}, "version"},
		{"many versions", Registration{Resource: "example.com/gpu", Endpoint: ep, Versions: strings.Split(strings.Repeat("v1beta1,", 40)+"v1", ","), Path: PathPluginsRegistry},
			"more than 256"},
		{"version not UTF-8", Registration{Resource: "example.com/gpu", Endpoint: ep, Versions: []string{"v1\xff"}, Path: PathPluginsRegistry}, "UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateRegistration(tc.r)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("valid registration refused: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want InvalidArgument containing %q", err, tc.msg)
			}
			if n := len(err.Error()); n > 2*bounds.MaxEcho+200 {
				t.Fatalf("error of %d bytes", n)
			}
		})
	}
}
