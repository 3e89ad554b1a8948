package kubeletrules

import (
	"strings"
	"testing"
)

func TestChooseDRAService(t *testing.T) {
	tests := []struct {
		services []string
		want     string
		wantErr  string
	}{
		{[]string{"v1.DRAPlugin"}, "v1.DRAPlugin", ""},
		{[]string{"v1alpha4.DRAPlugin", "v1beta1.DRAPlugin"}, "v1beta1.DRAPlugin", ""},
		{nil, "", "empty list of supported gRPC services"},
		{[]string{"v1alpha4.DRAPlugin"}, "", "none of services supported by the plugin"},
	}
	for _, tt := range tests {
		got, err := ChooseDRAService(tt.services)
		if got != tt.want || (err == nil) != (tt.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("ChooseDRAService(%q) = %q, %v; want %q, %q", tt.services, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestHighestCSIVersion(t *testing.T) {
	tests := []struct {
		versions []string
		want     string
		wantErr  string
	}{
		{[]string{"1.0.0"}, "1.0.0", ""},
		{[]string{"0.3.0", "1.2.0"}, "1.2.0", ""},
		{nil, "", "Plugin returned an empty list for supported versions"},
		{[]string{"2.0.0"}, "", "None of the versions specified"},
	}
	for _, tt := range tests {
		v, err := HighestCSIVersion("ValidatePlugin", "csi.example.com", tt.versions)
		switch {
		case tt.wantErr != "":
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "kubernetes.io/csi: ValidatePlugin for CSI driver \"csi.example.com\"") {
				t.Errorf("HighestCSIVersion(%q): %v, want an error with %q", tt.versions, err, tt.wantErr)
			}
		case err != nil || v.String() != tt.want:
			t.Errorf("HighestCSIVersion(%q) = %v, %v; want %s", tt.versions, v, err, tt.want)
		}
	}
}

// The legacy Register's errors are the kubelet's words: its supported
// versions are a list formatted with %q (server.go, errUnsupportedVersion).
func TestValidateLegacyRegister(t *testing.T) {
	tests := []struct {
		version, resource, want string
	}{
		{"v1beta1", "example.com/gpu", ""},
		{"v1alpha", "example.com/gpu", `requested API version "v1alpha" is not supported by kubelet. Supported version is ["v1beta1"]`},
		{"", "example.com/gpu", `requested API version "" is not supported by kubelet. Supported version is ["v1beta1"]`},
		{"v1beta1", "gpu", `the ResourceName "gpu" is invalid`},
	}
	for _, tt := range tests {
		err := ValidateLegacyRegister(tt.version, tt.resource)
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tt.want {
			t.Errorf("ValidateLegacyRegister(%q, %q) = %q, want %q", tt.version, tt.resource, got, tt.want)
		}
	}
}
