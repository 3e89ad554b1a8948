package manager

import (
	"errors"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/errdefs"
)

// TestValidateRegistration: the kubelet's checks and messages, per
// registration path, as InvalidArgument.
func TestValidateRegistration(t *testing.T) {
	v1 := []string{"v1beta1"}
	tests := []struct {
		name string
		r    Registration
		msg  string // empty: valid
	}{
		{"registry ok", Registration{Resource: "example.com/gpu", Versions: []string{"v1alpha", "v1beta1"}, Path: PathPluginsRegistry}, ""},
		{"legacy ok", Registration{Resource: "vendor.io/a_b.c-d", Versions: v1, Path: PathKubeletSock}, ""},
		{"registry version", Registration{Resource: "example.com/gpu", Versions: []string{"v1alpha"}, Path: PathPluginsRegistry},
			"manager version, v1beta1, is not among plugin supported versions [v1alpha]"},
		{"legacy version", Registration{Resource: "example.com/gpu", Versions: []string{"v1alpha"}, Path: PathKubeletSock},
			`requested API version "v1alpha" is not supported by kubelet. Supported version is "v1beta1"`},
		{"legacy no version", Registration{Resource: "example.com/gpu", Path: PathKubeletSock},
			`requested API version "" is not supported by kubelet`},
		{"registry name", Registration{Resource: "gpu", Versions: v1, Path: PathPluginsRegistry},
			`invalid name of device plugin socket: the ResourceName "gpu" is invalid`},
		{"legacy kubernetes.io", Registration{Resource: "kubernetes.io/gpu", Versions: v1, Path: PathKubeletSock},
			`the ResourceName "kubernetes.io/gpu" is invalid`},
		{"requests. prefix", Registration{Resource: "requests.example.com/gpu", Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"no name after the slash", Registration{Resource: "example.com/", Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"no domain", Registration{Resource: "/gpu", Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"upper case domain", Registration{Resource: "Example.com/gpu", Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"bad name start", Registration{Resource: "example.com/-gpu", Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"name too long", Registration{Resource: "example.com/" + strings.Repeat("a", 64), Versions: v1, Path: PathKubeletSock}, "is invalid"},
		{"two slashes", Registration{Resource: "a/b/c", Versions: v1, Path: PathKubeletSock}, "is invalid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := validateRegistration(tc.r)
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("valid registration refused: %v", err)
				}
				return
			}
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("err = %v, want InvalidArgument containing %q", err, tc.msg)
			}
		})
	}
}
