package server

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/allocator"
	"github.com/nodeplug/nodeplug/services/devicemanager/internal/deviceplugin/manager"
)

// The request validation fuzzers run what the gRPC adapters run on a
// request before anything touches a socket or the state: the conversion
// from the wire type and the domain's validation. Every refusal must be
// InvalidArgument with a short message; everything accepted must be within
// the bounds.

// fuzzDir stands for the device-plugins directory.
const fuzzDir = "/var/lib/kubelet/device-plugins"

func checkRefusal(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("refusal %q does not wrap ErrInvalidArgument", err)
	}
	if n := len(err.Error()); n > maxErr {
		t.Fatalf("error of %d bytes: %.300q", n, err.Error())
	}
}

func printable(s string, max int) bool {
	return s != "" && len(s) <= max && utf8.ValidString(s) && !strings.ContainsAny(s, "\x00\n\r")
}

// FuzzLegacyRegisterRequest: a legacy Register's file name and fields.
// Accepted: a name with no '/' joined to the directory, within the path
// limit, and a resource name within the bounds.
func FuzzLegacyRegisterRequest(f *testing.F) {
	for _, s := range [][3]string{
		{pluginapi.Version, "gpu.sock", "example.com/gpu"},
		{pluginapi.Version, "%2E%2E%2F%2E%2E%2Fvictim.sock", "example.com/gpu"},
		{pluginapi.Version, "lnk#x", "example.com/gpu"},
		{pluginapi.Version, "q?x", "example.com/gpu"},
		{pluginapi.Version, "d%41.sock", "example.com/gpu"},
		{pluginapi.Version, "../x.sock", "example.com/gpu"},
		{pluginapi.Version, "..", "example.com/gpu"},
		{pluginapi.Version, "a\x00b", "example.com/gpu"},
		{pluginapi.Version, "a\nb", "example.com/gpu"},
		{pluginapi.Version, strings.Repeat("n", 200), "example.com/gpu"},
		{pluginapi.Version, "gpu.sock", strings.Repeat("r", 1000)},
		{pluginapi.Version, "gpu.sock", "kubernetes.io/gpu"},
		{"v1alpha", "gpu.sock", "example.com/gpu"},
		{strings.Repeat("v", 1000), "gpu.sock", "example.com/gpu"},
		{"", "", ""},
	} {
		f.Add(s[0], s[1], s[2])
	}
	f.Fuzz(func(t *testing.T, version, endpoint, resource string) {
		req := &pluginapi.RegisterRequest{Version: version, Endpoint: endpoint, ResourceName: resource}
		r, err := legacyRegistration(fuzzDir, req)
		if err == nil {
			err = manager.ValidateRegistration(r)
		}
		if err != nil {
			checkRefusal(t, err)
			return
		}
		if strings.Contains(endpoint, "/") || filepath.Dir(r.Endpoint) != fuzzDir || len(r.Endpoint) > unixsock.MaxPathLen {
			t.Fatalf("endpoint %q accepted as %q", endpoint, r.Endpoint)
		}
		if !printable(r.Resource, bounds.MaxName) || version != pluginapi.Version {
			t.Fatalf("accepted %+v", r)
		}
	})
}

// FuzzRegisterPluginRequest: RegisterPlugin's fields. Accepted: names,
// paths and the generation within the bounds, and v1beta1 among the
// versions.
func FuzzRegisterPluginRequest(f *testing.F) {
	for _, s := range [][5]string{
		{"example.com/gpu", "/var/lib/kubelet/plugins_registry/gpu.sock", "/var/lib/kubelet/plugins_registry/gpu.sock", "1:2:b3", pluginapi.Version},
		{"example.com/gpu", "/r/plugins_registry/lnk#x", "", "g", pluginapi.Version},
		{"example.com/gpu", "/r/plugins_registry/%2E%2E%2Fvictim.sock", "", "g", pluginapi.Version},
		{"example.com/gpu", "relative.sock", "", "g", pluginapi.Version},
		{"example.com/gpu", "/" + strings.Repeat("p", 200), "", "g", pluginapi.Version},
		{strings.Repeat("r", 1000), "/r/x.sock", "", "g", pluginapi.Version},
		{"example.com/gpu", "/r/x.sock", "", strings.Repeat("g", 1000), pluginapi.Version},
		{"example.com/gpu", "/r/x.sock", "/r/\n", "g", pluginapi.Version},
		{"example.com/gpu", "/r/x.sock", "", "g", "v1alpha"},
		{"example.com/gpu", "/r/x.sock", "", "g", strings.Repeat("v", 300)},
		{"", "", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], uint8(1))
	}
	f.Fuzz(func(t *testing.T, resource, endpoint, socketPath, generation, version string, copies uint8) {
		versions := make([]string, int(copies%64))
		for i := range versions {
			versions[i] = version
		}
		r := registrationFromAPI(&dmv1.RegisterPluginRequest{
			ResourceName: resource, Endpoint: endpoint, SocketPath: socketPath, Generation: generation, Versions: versions,
		})
		if err := manager.ValidateRegistration(r); err != nil {
			checkRefusal(t, err)
			return
		}
		if !printable(r.Resource, bounds.MaxName) || !printable(r.Endpoint, unixsock.MaxPathLen) ||
			(r.SocketPath != "" && !printable(r.SocketPath, unixsock.MaxPathLen)) || len(r.Generation) > 256 || version != pluginapi.Version {
			t.Fatalf("accepted %+v", r)
		}
	})
}

// FuzzAllocateRequest: Allocate's fields. Accepted: a pod UID, a container
// name, resource names and must-include IDs within the bounds, counts
// above zero.
func FuzzAllocateRequest(f *testing.F) {
	for _, s := range []struct {
		pod, container, resource, must string
		count                          int64
		n                              uint8
	}{
		{"0d6b1a6e-0c0f-4f0e-9a8e-3f0c1e7d2b11", "app", "example.com/gpu", "", 1, 1},
		{"pod", "c", "example.com/gpu", "dev-0", 2, 1},
		{"pod\x00", "c", "example.com/gpu", "", 1, 1},
		{"pod\n", "c", "example.com/gpu", "", 1, 1},
		{strings.Repeat("p", 1000), "c", "example.com/gpu", "", 1, 1},
		{"pod", strings.Repeat("c", 1000), "example.com/gpu", "", 1, 1},
		{"pod", "c", strings.Repeat("r", 1000), "", 1, 1},
		{"pod", "c", "example.com/gpu", strings.Repeat("d", 1000), 1, 1},
		{"pod", "c", "example.com/gpu", "", 0, 1},
		{"pod", "c", "example.com/gpu", "", -5, 1},
		{"pod", "c", "example.com/gpu", "", 1, 0},
		{"pod", "c", "example.com/gpu", "", 1, 100},
		{"", "", "", "", 0, 0},
	} {
		f.Add(s.pod, s.container, s.resource, s.must, s.count, s.n)
	}
	f.Fuzz(func(t *testing.T, pod, container, resource, must string, count int64, n uint8) {
		req := &dmv1.AllocateRequest{PodUid: pod, ContainerName: container}
		for i := range int(n % 80) {
			rr := &dmv1.ResourceRequest{ResourceName: resource, Count: count}
			if i > 0 {
				rr.ResourceName = resource + strings.Repeat("x", i)
			}
			if must != "" {
				rr.MustIncludeDeviceIds = []string{must}
			}
			req.Resources = append(req.Resources, rr)
		}
		ar := allocateRequestFromAPI(req)
		if err := allocator.ValidateRequest(ar); err != nil {
			checkRefusal(t, err)
			return
		}
		if !printable(ar.PodUID, bounds.MaxPodUID) || !printable(ar.Container, bounds.MaxContainerName) || len(ar.Resources) == 0 {
			t.Fatalf("accepted %+v", ar)
		}
		for _, rr := range ar.Resources {
			if !printable(rr.Name, bounds.MaxName) || rr.Count <= 0 || int64(len(rr.MustInclude)) > rr.Count {
				t.Fatalf("accepted %+v", rr)
			}
			for _, id := range rr.MustInclude {
				if !printable(id, bounds.MaxDeviceID) {
					t.Fatalf("accepted device %q", id)
				}
			}
		}
	})
}
