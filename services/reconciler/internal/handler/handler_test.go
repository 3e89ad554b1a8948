package handler

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// The device plugin handler accepts exactly the kubelet's extended
// resource names.
func TestDevicePluginResourceNames(t *testing.T) {
	dp := NewDevicePlugin(nil)
	for name, want := range map[string]bool{
		"example.com/gpu":                        true,
		"nvidia.com/gpu":                         true,
		"gpu":                                    false, // no namespace: native
		"kubernetes.io/gpu":                      false,
		"example.kubernetes.io/gpu":              false,
		"requests.example.com/gpu":               false,
		"example.com/":                           false,
		"example.com/has space":                  false,
		"-bad.com/gpu":                           false,
		"example.com/" + strings.Repeat("a", 63): true,
		"example.com/" + strings.Repeat("a", 64): false,
	} {
		err := dp.Validate(context.Background(), name, "/e.sock", []string{"v1beta1"})
		if got := err == nil; got != want {
			t.Errorf("Validate(%q) = %v, want accepted %v", name, err, want)
		}
		if err != nil && err.Error() != fmt.Sprintf("invalid name of device plugin socket: the ResourceName %q is invalid", name) {
			t.Errorf("Validate(%q) = %q, not the kubelet's message", name, err)
		}
	}
}

func TestValidate(t *testing.T) {
	drivers := NewDrivers()
	dp := NewDevicePlugin(nil)
	csiH := NewCSI(drivers, nil)
	dra := NewDRA(drivers, nil)
	for _, tc := range []struct {
		name     string
		h        cache.Handler
		plugin   string
		versions []string
		wantErr  string
	}{
		{"device ok", dp, "example.com/gpu", []string{"v1alpha", "v1beta1"}, ""},
		{"device version", dp, "example.com/gpu", []string{"v1"}, "manager version, v1beta1, is not among plugin supported versions [v1]"},
		{"device name", dp, "gpu", []string{"v1beta1"}, `invalid name of device plugin socket: the ResourceName "gpu" is invalid`},
		{"csi ok", csiH, "csi.example.com", []string{"0.3.0", "1.0.0"}, ""},
		{"csi v-prefixed", csiH, "csi.example.com", []string{"v1.5.0"}, ""},
		{"csi none", csiH, "csi.example.com", nil, `kubernetes.io/csi: ValidatePlugin for CSI driver "csi.example.com" failed. Plugin returned an empty list for supported versions`},
		{"csi only 0.x", csiH, "csi.example.com", []string{"0.3.0"}, "None of the versions specified"},
		{"csi only 2.x", csiH, "csi.example.com", []string{"2.0.0"}, "None of the versions specified"},
		{"dra v1", dra, "dra.example.com", []string{"v1.DRAPlugin"}, ""},
		{"dra v1beta1", dra, "dra.example.com", []string{"v1beta1.DRAPlugin"}, ""},
		{"dra empty", dra, "dra.example.com", nil, "invalid supported gRPC versions of DRA driver plugin dra.example.com at endpoint /e.sock: empty list of supported gRPC services (aka supported versions)"},
		{"dra unknown", dra, "dra.example.com", []string{"1.0.0"}, "none of services supported by the plugin"},
		{"dra no name", dra, "", []string{"v1.DRAPlugin"}, "empty driver name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.h.Validate(context.Background(), tc.plugin, "/e.sock", tc.versions)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate = %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

// The kubelet refuses a CSI driver whose name is already registered on
// another endpoint with an equal or higher version.
func TestCSIRefusesLowerVersionOfRegisteredDriver(t *testing.T) {
	drivers := NewDrivers()
	h := NewCSI(drivers, nil)
	drivers.put(Driver{Type: TypeCSIPlugin, Name: "csi.example.com", Endpoint: "/a.sock", SocketPath: "/a.sock", CSI: &CSINode{HighestVersion: "1.2.0"}})
	if err := h.Validate(context.Background(), "csi.example.com", "/b.sock", []string{"1.1.0"}); err == nil || !strings.Contains(err.Error(), "higher supported version") {
		t.Fatalf("Validate = %v", err)
	}
	if err := h.Validate(context.Background(), "csi.example.com", "/b.sock", []string{"1.3.0"}); err != nil {
		t.Fatalf("Validate of a higher version = %v", err)
	}
	if err := h.Validate(context.Background(), "csi.example.com", "/a.sock", []string{"1.2.0"}); err != nil {
		t.Fatalf("Validate of the same endpoint = %v", err)
	}
}

// One registry holds CSI and DRA drivers by registration socket: a
// deregistration removes the record only when it is of its type and
// generation, so a socket recreated as another type, or with a newer
// generation, keeps the new record when the old one is deregistered.
func TestDriversRemoveOnlyTheirOwnRecord(t *testing.T) {
	d := NewDrivers()
	d.put(Driver{Type: TypeDRAPlugin, Name: "dra.example.com", SocketPath: "/s.sock", Generation: "2"})
	d.put(Driver{Type: TypeCSIPlugin, Name: "csi.example.com", SocketPath: "/c.sock", Generation: "1", CSI: &CSINode{NodeID: "n"}})
	d.remove(TypeCSIPlugin, "/s.sock", "2")
	d.remove(TypeDRAPlugin, "/s.sock", "1")
	if got := d.List(TypeDRAPlugin); len(got) != 1 || got[0].Generation != "2" {
		t.Fatalf("DRA drivers = %+v after removals of another type and generation", got)
	}
	if got := d.List(TypeCSIPlugin); len(got) != 1 || got[0].Name != "csi.example.com" {
		t.Fatalf("CSI drivers = %+v", got)
	}
	d.remove(TypeDRAPlugin, "/s.sock", "2")
	if got := d.List(TypeDRAPlugin); len(got) != 0 {
		t.Fatalf("DRA drivers = %+v after its own removal", got)
	}
}

// TestDriversNamedFollowsPutAndRemove: the index by type and name that a
// registration reads follows every change of the records: a socket put
// again under another name or type moves, a removal leaves it.
func TestDriversNamedFollowsPutAndRemove(t *testing.T) {
	d := NewDrivers()
	d.put(Driver{Type: TypeDRAPlugin, Name: "a.example.com", SocketPath: "/2.sock", Generation: "1"})
	d.put(Driver{Type: TypeDRAPlugin, Name: "a.example.com", SocketPath: "/1.sock", Generation: "1"})
	d.put(Driver{Type: TypeCSIPlugin, Name: "a.example.com", SocketPath: "/3.sock", Generation: "1", CSI: &CSINode{}})
	paths := func(ds []Driver) (out []string) {
		for _, x := range ds {
			out = append(out, x.SocketPath)
		}
		return out
	}
	if got := paths(d.Named(TypeDRAPlugin, "a.example.com")); !slices.Equal(got, []string{"/1.sock", "/2.sock"}) {
		t.Fatalf("Named(DRA, a) = %v", got)
	}
	// The same socket, recreated as another driver.
	d.put(Driver{Type: TypeDRAPlugin, Name: "b.example.com", SocketPath: "/2.sock", Generation: "2"})
	if got := paths(d.Named(TypeDRAPlugin, "a.example.com")); !slices.Equal(got, []string{"/1.sock"}) {
		t.Fatalf("Named(DRA, a) = %v after /2.sock became b's", got)
	}
	if got := paths(d.Named(TypeDRAPlugin, "b.example.com")); !slices.Equal(got, []string{"/2.sock"}) {
		t.Fatalf("Named(DRA, b) = %v", got)
	}
	d.remove(TypeDRAPlugin, "/2.sock", "1") // the old generation: b's record stays
	d.remove(TypeDRAPlugin, "/1.sock", "1")
	if got := paths(d.Named(TypeDRAPlugin, "a.example.com")); len(got) != 0 {
		t.Fatalf("Named(DRA, a) = %v after its removal", got)
	}
	if got := paths(d.Named(TypeDRAPlugin, "b.example.com")); !slices.Equal(got, []string{"/2.sock"}) {
		t.Fatalf("Named(DRA, b) = %v after the removal of an older generation", got)
	}
	if got := paths(d.Named(TypeCSIPlugin, "a.example.com")); !slices.Equal(got, []string{"/3.sock"}) {
		t.Fatalf("Named(CSI, a) = %v", got)
	}
}
