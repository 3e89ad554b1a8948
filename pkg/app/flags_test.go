package app

import (
	"reflect"
	"testing"
)

func TestFlagsEnvFallback(t *testing.T) {
	t.Setenv("NODEPLUG_ROOT_DIR", "/from/env")
	t.Setenv("NODEPLUG_WATCHER_LISTEN", "127.0.0.1:1")
	t.Setenv("NODEPLUG_RECONCILER_LISTEN", "127.0.0.1:2") // another binary's: ignored
	t.Setenv("NODEPLUG_WATCHER_ALLOWED_ENDPOINT_DIR", "/a:/b")
	cfg := Config{}
	fs := NewFlags("watcher")
	commonFlags(Service{DefaultListen: "127.0.0.1:50051"}, fs, &cfg)
	dirs := fs.StringList("allowed-endpoint-dir", "")
	if err := fs.Parse([]string{"--log-level", "debug", "--root-dir", "/from/flag"}); err != nil {
		t.Fatal(err)
	}
	if cfg.RootDir != "/from/flag" {
		t.Errorf("root dir %q: a flag must win over its variable", cfg.RootDir)
	}
	if cfg.Listen != "127.0.0.1:1" {
		t.Errorf("listen %q, want the NODEPLUG_WATCHER_LISTEN value", cfg.Listen)
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
