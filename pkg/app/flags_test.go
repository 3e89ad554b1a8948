package app

import (
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestFlagsEnvFallback(t *testing.T) {
	t.Setenv("NODEPLUG_ROOT_DIR", "/from/env")
	t.Setenv("NODEPLUG_WATCHER_API_SOCKET", "/run/w.sock")
	t.Setenv("NODEPLUG_RECONCILER_API_SOCKET", "/run/r.sock") // another binary's: ignored
	t.Setenv("NODEPLUG_WATCHER_ALLOWED_ENDPOINT_DIR", "/a:/b")
	cfg := Config{}
	fs := NewFlags("watcher")
	commonFlags(Service{Binary: "watcher"}, fs, &cfg)
	dirs := fs.StringList("allowed-endpoint-dir", "")
	if err := fs.Parse([]string{"--log-level", "debug", "--root-dir", "/from/flag"}); err != nil {
		t.Fatal(err)
	}
	if cfg.RootDir != "/from/flag" {
		t.Errorf("root dir %q: a flag must win over its variable", cfg.RootDir)
	}
	if cfg.APISocket != "/run/w.sock" {
		t.Errorf("API socket %q, want the NODEPLUG_WATCHER_API_SOCKET value", cfg.APISocket)
	}
	if cfg.LogLevel != "debug" {
		t.Errorf("log level %q", cfg.LogLevel)
	}
	if !reflect.DeepEqual(*dirs, []string{"/a", "/b"}) {
		t.Errorf("allowed dirs %v", *dirs)
	}
	if got := fs.EnvName("metrics-listen"); got != "NODEPLUG_WATCHER_METRICS_LISTEN" {
		t.Errorf("EnvName = %s", got)
	}
}

// TestListenIsGone: --listen and its variable are refused with an error
// naming the new flags.
func TestListenIsGone(t *testing.T) {
	svc := Service{Binary: "watcher"}
	for _, tc := range []struct {
		name string
		args []string
		env  string
	}{
		{"flag", []string{"--listen", "127.0.0.1:50051"}, ""},
		{"variable", nil, "127.0.0.1:50051"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("NODEPLUG_WATCHER_LISTEN", tc.env)
			}
			cfg := Config{}
			fs := NewFlags("watcher")
			fs.SetOutput(io.Discard)
			commonFlags(svc, fs, &cfg)
			err := fs.Parse(tc.args)
			if err == nil {
				t.Fatal("--listen was accepted")
			}
			for _, want := range []string{"--api-socket", "--listen-tcp", "docs/upgrading.md"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %s", err, want)
				}
			}
		})
	}
}

func TestValidateListeners(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"socket only", Config{}, true},
		{"tcp without tls", Config{ListenTCP: "127.0.0.1:1"}, false},
		{"tcp with tls", Config{ListenTCP: "0.0.0.0:1", TLS: TLS{CertFile: "c", KeyFile: "k", ClientCAFile: "ca"}}, true},
		{"insecure on loopback", Config{ListenTCP: "127.0.0.1:1", TLS: TLS{Insecure: true}}, true},
		{"insecure off loopback", Config{ListenTCP: "0.0.0.0:1", TLS: TLS{Insecure: true}}, false},
		{"pprof on loopback", Config{Pprof: true, MetricsListen: "127.0.0.1:9451"}, true},
		{"pprof off loopback", Config{Pprof: true, MetricsListen: "0.0.0.0:9451"}, false},
	} {
		if err := tc.cfg.validate(); (err == nil) != tc.ok {
			t.Errorf("%s: validate = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestLookupGroup: --api-group and --operator-group take a numeric GID
// (images have no /etc/group) or a group name; empty means none.
func TestLookupGroup(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"", -1, true},
		{"4242", 4242, true},
		{"0", 0, true},
		{"root", 0, true},
		{"no-such-group-nodeplug", -1, false},
		{"-5", -1, false},
	} {
		got, err := lookupGroup("operator-group", tc.in)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("lookupGroup(%q) = %d, %v; want %d, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--operator-group") {
			t.Errorf("lookupGroup(%q) error %q does not name the flag", tc.in, err)
		}
	}
}
