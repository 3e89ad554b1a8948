package reconciler

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/nodeplug/nodeplug/pkg/bounds"
	"github.com/nodeplug/nodeplug/pkg/errdefs"
	"github.com/nodeplug/nodeplug/pkg/unixsock"
	"github.com/nodeplug/nodeplug/services/reconciler/internal/cache"
)

// maxRefusal bounds the reason a refused plugin is given, whatever it
// said: its name and type are echoed quoted (at most bounds.MaxEcho bytes
// each, escaped), the cause quotes at most bounds.MaxEcho bytes of the
// offending value, and the socket path is the watcher's.
const maxRefusal = 6 << 10

// versionSep separates the supported versions in the fuzzer's input.
const versionSep = "\x1f"

// FuzzGetInfoAnswer feeds checkInfo every kind of GetInfo answer: it never
// panics; what it accepts is within DESIGN "Bounds"; what it refuses is
// refused with a short reason, and what is recorded of it is clipped.
func FuzzGetInfoAnswer(f *testing.F) {
	long := strings.Repeat("a", 100<<10)
	for _, seed := range [][4]string{
		{"DRAPlugin", "dra.example.com", "", "v1.DRAPlugin"},
		{"DevicePlugin", "example.com/gpu", "/var/lib/kubelet/plugins_registry/gpu.sock", "v1beta1"},
		{"CSIPlugin", "csi.example.com", "/var/lib/kubelet/plugins/csi/csi.sock", "0.3.0" + versionSep + "1.0.0"},
		{"DRAPlugin", long, "", "v1.DRAPlugin"},
		{long, "dra.example.com", "", "v1.DRAPlugin"},
		{"DRAPlugin", "dra.example.com", "/" + long, "v1.DRAPlugin"},
		{"DRAPlugin", "dra.example.com", "", long},
		{"DRAPlugin", "dra.example.com", "", strings.Repeat("v1"+versionSep, 10000)},
		{"DRAPlugin", "dra\nexample.com", "", "v1.DRAPlugin"},
		{"DRAPlugin", "dra.example.com", "/a\x00b.sock", "v1.DRAPlugin"},
		{"DRAPlugin", "dra.example.com", "/" + strings.Repeat("d", unixsock.MaxPathLen), "v1.DRAPlugin"},
		{"DRAPlugin", "\xff\xfe", "", "\x00"},
		{"", "", "", ""},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	f.Fuzz(func(t *testing.T, typ, name, endpoint, versions string) {
		p := cache.Plugin{SocketPath: "/var/lib/kubelet/plugins_registry/p.sock", Type: typ, Name: name, Endpoint: endpoint}
		if versions != "" {
			p.Versions = strings.Split(versions, versionSep)
		}
		err := checkInfo(p)
		if err == nil {
			if len(p.Name) == 0 || len(p.Name) > bounds.MaxName || len(p.Type) > bounds.MaxName ||
				len(p.Endpoint) > unixsock.MaxPathLen || len(p.Versions) > MaxVersions {
				t.Fatalf("accepted an answer past the bounds: name %d bytes, type %d, endpoint %d, %d versions",
					len(p.Name), len(p.Type), len(p.Endpoint), len(p.Versions))
			}
			for _, v := range p.Versions {
				if len(v) > MaxVersionLen {
					t.Fatalf("accepted a version of %d bytes", len(v))
				}
			}
			return
		}
		if !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Fatalf("checkInfo = %v, not an invalid argument", err)
		}
		c := clipped(p)
		if len(c.Name) > bounds.MaxEcho || len(c.Type) > bounds.MaxEcho || len(c.Endpoint) > bounds.MaxEcho || len(c.Versions) > MaxVersions {
			t.Fatalf("clipped answer keeps name %d bytes, type %d, endpoint %d, %d versions", len(c.Name), len(c.Type), len(c.Endpoint), len(c.Versions))
		}
		for _, v := range c.Versions {
			if len(v) > bounds.MaxEcho {
				t.Fatalf("clipped answer keeps a version of %d bytes", len(v))
			}
		}
		reason := refusal(c, fmt.Errorf("plugin validation failed: %w", err)).Error()
		if len(reason) > maxRefusal {
			t.Fatalf("the reason the plugin is given is %d bytes, more than %d: %.300q…", len(reason), maxRefusal, reason)
		}
	})
}

// The bounds in words: each answer past one is refused with the reason
// naming the bound, and a 100 KB name is not echoed back.
func TestCheckInfo(t *testing.T) {
	long := strings.Repeat("n", 100<<10)
	for _, tc := range []struct {
		name string
		p    cache.Plugin
		want string
	}{
		{"ok", cache.Plugin{Name: "dra.example.com", Type: "DRAPlugin", Versions: []string{"v1.DRAPlugin"}}, ""},
		{"empty type is left to the handler lookup", cache.Plugin{Name: "x.example.com"}, ""},
		{"long name", cache.Plugin{Name: long, Type: "DRAPlugin"}, "plugin name \"nnnn"},
		{"empty name", cache.Plugin{Type: "DRAPlugin"}, "plugin name is empty"},
		{"newline in name", cache.Plugin{Name: "a\nb", Type: "DRAPlugin"}, "unprintable"},
		{"long type", cache.Plugin{Name: "a", Type: long}, "plugin type"},
		{"endpoint past a socket path", cache.Plugin{Name: "a", Endpoint: "/" + strings.Repeat("e", unixsock.MaxPathLen)}, "longer than the 107-byte limit"},
		{"NUL in endpoint", cache.Plugin{Name: "a", Endpoint: "/a\x00"}, "NUL"},
		{"too many versions", cache.Plugin{Name: "a", Versions: make([]string, MaxVersions+1)}, "17 supported versions"},
		{"long version", cache.Plugin{Name: "a", Versions: []string{long}}, "supported version"},
		{"unprintable version", cache.Plugin{Name: "a", Versions: []string{"v1\x00"}}, "not printable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkInfo(tc.p)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("checkInfo = %v", err)
			case tc.want == "":
				return
			case err == nil || !strings.Contains(err.Error(), tc.want):
				t.Fatalf("checkInfo = %v, want %q", err, tc.want)
			case len(err.Error()) > 2*bounds.MaxEcho:
				t.Fatalf("error of %d bytes", len(err.Error()))
			}
		})
	}
}
