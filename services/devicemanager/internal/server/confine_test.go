package server

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/nodeplug/nodeplug/internal/sampleplugin"
	"github.com/nodeplug/nodeplug/internal/testutil"
	"github.com/nodeplug/nodeplug/internal/testutil/plugintest"
	dmv1 "github.com/nodeplug/nodeplug/pkg/api/nodeplug/devicemanager/v1"
	"github.com/nodeplug/nodeplug/pkg/rpcutil"
)

// encodeAll percent-encodes every byte of s, as an attacker writes a path
// that a URL parser would decode into another one.
func encodeAll(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "%%%02X", s[i])
	}
	return b.String()
}

// outsidePlugin starts a plugin whose socket is outside the env's root: no
// registration may ever reach it.
func outsidePlugin(t *testing.T, resource string) *sampleplugin.Plugin {
	t.Helper()
	p := plugintest.Start(t, sampleplugin.Options{Resource: resource, Devices: 2, SocketPath: filepath.Join(testutil.TempDir(t), "victim.sock"), Log: testLogger(t)})
	return p
}

func untouched(t *testing.T, ps ...*sampleplugin.Plugin) {
	t.Helper()
	for _, p := range ps {
		if calls := p.Calls(); len(calls) != 0 {
			t.Errorf("%s (%s) received calls: %v", p.Resource(), p.SocketPath(), calls)
		}
	}
}

// TestEscapesRefused: endpoint names that a URL parser turns into another
// path ("%2E%2E%2F" decoded to "../", '#' and '?' cutting the path, "%6C"
// decoded to 'l') are dialled as the bytes they are. Whether no file has
// that name (refused by the confinement) or a socket file inside the root
// has it exactly (dialled, and it refuses), the socket outside the root
// that the decoded or cut path names never receives a call, by either
// registration path. A control at the end dials the same names as
// "unix://" URLs and reaches that socket: the names are real escapes.
func TestEscapesRefused(t *testing.T) {
	e := newEnv(t, time.Minute)
	victim := outsidePlugin(t, "example.com/victim")
	// lnk → the victim, beside the names that a parser cuts to lnk.
	for _, dir := range []string{e.dpDir, e.regDir} {
		if err := os.Symlink(victim.SocketPath(), filepath.Join(dir, "lnk")); err != nil {
			t.Fatal(err)
		}
	}
	names := func(dir string) []string {
		rel, err := filepath.Rel(dir, victim.SocketPath())
		if err != nil {
			t.Fatal(err)
		}
		return []string{
			strings.NewReplacer(".", "%2E", "/", "%2F").Replace(rel), // %2E%2E%2F…%2Fvictim%2Esock
			strings.ReplaceAll(rel, "/", "%2F"),                      // ..%2F..%2F…%2Fvictim.sock
			encodeAll(rel),                                           // every byte encoded: too long to bind
			"lnk#x", "lnk?x", "%6Cnk",
			"lnk", // the link itself resolves outside
		}
	}

	conn, err := rpcutil.DialPeer(e.kubeletSock())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	kc := pluginapi.NewRegistrationClient(conn)
	register := map[string]func(dir, name string) error{
		"legacy": func(_, name string) error {
			_, err := kc.Register(ctxT(t), &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: name, ResourceName: "example.com/escape"})
			return err
		},
		"RegisterPlugin": func(dir, name string) error {
			ep := dir + "/" + name
			_, err := e.client.RegisterPlugin(ctxT(t), &dmv1.RegisterPluginRequest{
				ResourceName: "example.com/escape", Endpoint: ep, Versions: []string{pluginapi.Version}, SocketPath: ep, Generation: "g",
			})
			return err
		},
	}
	var escapes []string // paths a URL dialler would take to the victim
	for how, dir := range map[string]string{"legacy": e.dpDir, "RegisterPlugin": e.regDir} {
		for _, name := range names(dir) {
			path := dir + "/" + name
			t.Run(how+" "+name+" confined", func(t *testing.T) {
				// Refused: on nodeplug's API InvalidArgument, or
				// Unavailable for a name that no file has (waited for,
				// it never appeared); on kubelet.sock a plain error
				// (code Unknown), as the kubelet's.
				want := []codes.Code{codes.InvalidArgument, codes.Unavailable}
				if how == "legacy" {
					want = []codes.Code{codes.Unknown}
				}
				if err := register[how](dir, name); !slices.Contains(want, status.Code(err)) {
					t.Fatalf("%v; want one of %v", err, want)
				}
			})
			if name == "lnk" || len(path) > 107 {
				continue
			}
			testutil.StaleSocket(t, path)
			escapes = append(escapes, path)
			t.Run(how+" "+name+" dead socket", func(t *testing.T) {
				if err := register[how](dir, name); err == nil {
					t.Fatal("a socket nothing listens on registered")
				}
				if !e.logs.has("device plugin registration failed", "dial_path", path) {
					t.Errorf("no log names the path dialled, %q", path)
				}
			})
		}
	}
	untouched(t, victim)
	if r := e.resource("example.com/escape"); r != nil {
		t.Fatalf("an escape registered: %v", r)
	}

	// The control: dialled as URLs, the same paths reach the victim.
	for _, path := range escapes {
		c, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		before := victim.CallCount(sampleplugin.MethodGetDevicePluginOptions)
		_, err = pluginapi.NewDevicePluginClient(c).GetDevicePluginOptions(ctxT(t), &pluginapi.Empty{})
		_ = c.Close()
		if err != nil || victim.CallCount(sampleplugin.MethodGetDevicePluginOptions) != before+1 {
			t.Errorf("control: %q dialled as a URL did not reach the victim (%v): the test proves nothing for it", path, err)
		}
	}
}

// TestOddNamesRegisterUnderTheirRealPath: sockets whose names hold '#',
// '?', "%41", "%2F", spaces, or whose path is 107 bytes long register
// under exactly their path, by both registration paths; the sockets that a
// URL parser would have dialled instead ("dA.sock" for "d%41.sock", "a"
// for "a#b.sock") receive nothing. The log names the path dialled.
func TestOddNamesRegisterUnderTheirRealPath(t *testing.T) {
	e := newEnv(t, time.Minute)
	long := strings.Repeat("l", 107-len(e.regDir)-1-len(".sock")) + ".sock"
	if n := len(filepath.Join(e.regDir, long)); n != 107 {
		t.Fatalf("long path of %d bytes", n)
	}
	odd := []string{"d%41.sock", "a#b.sock", "q?x.sock", "sp ace.sock", "%2E%2E%2Fx.sock", long}
	decoys := []string{"dA.sock", "a", "q", "../x.sock"}
	for i, legacy := range []bool{true, false} {
		dir := e.regDir
		if legacy {
			dir = e.dpDir
		}
		var quiet []*sampleplugin.Plugin
		for _, name := range decoys {
			if name == "../x.sock" && !legacy {
				continue // regDir/../x.sock is the legacy case's root/x.sock
			}
			p := plugintest.Start(t, sampleplugin.Options{Resource: "example.com/decoy", Devices: 1, SocketPath: filepath.Join(dir, name), Log: testLogger(t)})
			quiet = append(quiet, p)
		}
		for j, name := range odd {
			if legacy && name == long {
				continue // the long name is for plugins_registry's path
			}
			res := "example.com/odd-" + string(rune('a'+i*10+j))
			p := plugintest.Start(t, sampleplugin.Options{Resource: res, Devices: 2, SocketPath: filepath.Join(dir, name), Log: testLogger(t)})
			var err error
			if legacy {
				err = p.Register(ctxT(t), e.kubeletSock())
			} else {
				_, err = e.register(p)
			}
			if err != nil {
				t.Fatalf("register %q (legacy %v): %v", p.SocketPath(), legacy, err)
			}
			r := e.waitCounts(res, 2, 2)
			ep := r.GetEndpoints()[0]
			if ep.GetEndpoint() != p.SocketPath() || ep.GetGeneration() != testutil.Generation(t, p.SocketPath()) {
				t.Fatalf("%q registered as %v", p.SocketPath(), ep)
			}
			if !e.logs.has("device plugin endpoint registered", "resource", res, "dial_path", p.SocketPath()) {
				t.Errorf("no log names the path dialled for %q:\n%s", p.SocketPath(), e.logs.String())
			}
		}
		untouched(t, quiet...)
	}
	if r := e.resource("example.com/decoy"); r != nil {
		t.Fatalf("a decoy registered: %v", r)
	}
}
